package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestConfigOfTheWrongKindIsRefused: a MigDeviceConfig for a claim that got
// a full GPU is refused at Prepare, naming both, whether it names the
// request (which the allocator turns into "all requests", since it is the
// claim's only one) or names none; never silently ignored. The refusal is
// an event on the pod and on the claim.
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
	// The refused pods' claims stay allocated, holding two GPUs, until
	// their namespaces go.
	t.Cleanup(func() { deleteNamespacesNamed(t, "wrong-kind-named", "wrong-kind-all") })
	for ns, cfg := range map[string]string{
		"wrong-kind-named": config("requests: [dev]\n        "),
		"wrong-kind-all":   config(""),
	} {
		apply(t, ctx, podWithTemplate(ns, "        exactly:\n          deviceClassName: gpu.nvidia.com\n"+cfg, "", "pod"))
		pod := waitForPod(t, ctx, ns, "pod", "refused", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
		reason := reasonOf(pod)
		if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName == "" {
			t.Errorf("%s: pod %s on %q, want Pending on a node", ns, pod.Status.Phase, pod.Spec.NodeName)
		}
		for _, want := range []string{"MigDeviceConfig", "full GPU", "GpuConfig"} {
			if !strings.Contains(reason, want) {
				t.Errorf("%s: reason %q does not name %q", ns, reason, want)
			}
		}
		waitForEvent(t, ctx, ns, "Pod", "pod", "PrepareFailed", "MigDeviceConfig")
	}
}
