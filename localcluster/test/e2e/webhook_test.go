package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/pkg/claimconfig"

	"github.com/gpudra/gpudra/localcluster/manifests"
)

// webhookName is the name of the chart's webhook in its
// ValidatingWebhookConfiguration, which the API server's refusals quote.
// The demo cluster runs the webhook's pod from the chart (see package
// install) for every namespace, as a cluster that installed the chart does.
const webhookName = "opaque-config.gpu.nvidia.com"

// webhookNamespace creates a namespace; it goes at the end of the test.
func webhookNamespace(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := demo.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = demo.Client().CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// Parameters the tests send: "intervall" is a misspelling of "interval".
const (
	misspeltGpuConfig = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}}`
	goodGpuConfig     = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}`
	badVfioConfig     = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "Iommufd"}}`
)

func claimWithConfig(name, params string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: "gpu.nvidia.com", Parameters: runtime.RawExtension{Raw: []byte(params)},
			}}}},
		}},
	}
}

// pluginMessage is what the kubelet plugin says of params at Prepare.
func pluginMessage(t *testing.T, params string) string {
	t.Helper()
	_, err := claimconfig.DecodeParameters([]byte(params), claimconfig.ValidationFeatures)
	if err == nil {
		t.Fatalf("the plugin accepts %s", params)
	}
	return err.Error()
}

// TestWebhookRefusesMisspeltConfigAtCreation: with `gpudra webhook`
// registered, a claim or template whose GpuConfig has a misspelt field is
// refused when it is created, with the plugin's exact message after the
// config's path (without the webhook it is created, and refused only when
// a pod's claim is prepared); a good claim is created.
func TestWebhookRefusesMisspeltConfigAtCreation(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	ns := webhookNamespace(t, ctx, "webhook-configs")
	refusal := `admission webhook "` + webhookName + `" denied the request: `

	// As a user applies it: YAML, which the API server stores as JSON.
	objs, err := manifests.Parse([]byte(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: misspelt
  namespace: `+ns+`
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: TimeSlicing
            timeSlicingConfig:
              intervall: Long
`), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	refused, err := demo.Apply(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	want := refusal + "spec.devices.config[0].opaque.parameters: " + pluginMessage(t, misspeltGpuConfig)
	if len(refused) != 1 || refused[0].Reason != want {
		t.Errorf("applying a claim with a misspelt field:\n got %v\nwant a refusal %q", refused, want)
	} else {
		t.Logf("refused at creation: %s", refused[0].Reason)
	}
	if !strings.Contains(want, `unknown field "sharing.timeSlicingConfig.intervall"`) {
		t.Errorf("the plugin's message %q does not name the field", want)
	}

	// A template, and a VfioDeviceConfig (which NVIDIA's webhook does not
	// check), each behind a good config.
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "misspelt"}}
	tmpl.Spec.Spec = claimWithConfig("", goodGpuConfig).Spec
	tmpl.Spec.Spec.Devices.Config = append(tmpl.Spec.Spec.Devices.Config, claimWithConfig("", misspeltGpuConfig).Spec.Devices.Config...)
	_, err = demo.Client().ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{})
	want = refusal + "spec.spec.devices.config[1].opaque.parameters: " + pluginMessage(t, misspeltGpuConfig)
	if err == nil || err.Error() != want {
		t.Errorf("template with a misspelt field:\n got %v\nwant %s", err, want)
	}
	vfio := claimWithConfig("bad-vfio", goodGpuConfig)
	vfio.Spec.Devices.Config = append(vfio.Spec.Devices.Config, claimWithConfig("", badVfioConfig).Spec.Devices.Config...)
	_, err = demo.Client().ResourceV1().ResourceClaims(ns).Create(ctx, vfio, metav1.CreateOptions{})
	want = refusal + "spec.devices.config[1].opaque.parameters: " + pluginMessage(t, badVfioConfig)
	if err == nil || err.Error() != want {
		t.Errorf("claim with a bad VfioDeviceConfig:\n got %v\nwant %s", err, want)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != 422 {
		t.Errorf("refusal %v: want status 422 Invalid", err)
	}

	// A good claim and a good template are created.
	if _, err := demo.Client().ResourceV1().ResourceClaims(ns).Create(ctx, claimWithConfig("good", goodGpuConfig), metav1.CreateOptions{}); err != nil {
		t.Errorf("good claim: %v", err)
	}
	tmpl.Spec.Spec = claimWithConfig("", goodGpuConfig).Spec
	if _, err := demo.Client().ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Errorf("good template: %v", err)
	}
	// A config of another driver is not the webhook's business.
	other := claimWithConfig("other-driver", misspeltGpuConfig)
	other.Spec.Devices.Config[0].Opaque.Driver = "nic.example.com"
	if _, err := demo.Client().ResourceV1().ResourceClaims(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Errorf("claim with a config of another driver: %v", err)
	}

	// A DeviceClass with a bad config is refused too; it is never created.
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "webhook-e2e.gpudra.io"}}
	class.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: claimWithConfig("", misspeltGpuConfig).Spec.Devices.Config[0].DeviceConfiguration}}
	_, err = demo.Client().ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{})
	want = refusal + "spec.config[0].opaque.parameters: " + pluginMessage(t, misspeltGpuConfig)
	if err == nil || err.Error() != want {
		t.Errorf("DeviceClass with a misspelt field:\n got %v\nwant %s", err, want)
		if err == nil {
			_ = demo.Client().ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
		}
	}
}
