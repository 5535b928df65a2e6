package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/localcluster/manifests"
)

// TestConfigOfTheWrongKindIsRefused: a MigDeviceConfig for a request whose
// DeviceClass gives a full GPU is refused when the template is created,
// naming both, whether it names the request or names none (for all
// requests, of which this is the only one): the webhook refuses what
// Prepare would refuse whatever the allocator picks. Prepare's own refusal
// of the same config is tested in the driver module (pkg/claimconfig,
// pkg/webhook), where the webhook cannot decide (another class,
// firstAvailable alternatives).
func TestConfigOfTheWrongKindIsRefused(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	config := func(requests string) string {
		return `      config:
      - ` + requests + `opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: MigDeviceConfig
            sharing: {strategy: MPS}
`
	}
	t.Cleanup(func() { deleteNamespacesNamed(t, "wrong-kind-named", "wrong-kind-all") })
	for ns, cfg := range map[string]string{
		"wrong-kind-named": config("requests: [dev]\n        "),
		"wrong-kind-all":   config(""),
	} {
		objs, err := manifests.Parse([]byte(podWithTemplate(ns, "        exactly:\n          deviceClassName: gpu.nvidia.com\n"+cfg, "", "pod")), t.Name())
		if err != nil {
			t.Fatal(err)
		}
		refused, err := demo.Apply(ctx, objs)
		if err != nil {
			t.Fatal(err)
		}
		var reason string
		for _, r := range refused {
			if r.Kind == "ResourceClaimTemplate" {
				reason = r.Reason
			}
		}
		if !strings.Contains(reason, "denied the request") {
			t.Fatalf("%s: template not refused at admission (refused: %v)", ns, refused)
		}
		for _, want := range []string{"MigDeviceConfig", "GpuConfig"} {
			if !strings.Contains(reason, want) {
				t.Errorf("%s: refusal %q does not name %q", ns, reason, want)
			}
		}
	}
}
