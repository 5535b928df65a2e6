package e2e

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/config"
	"github.com/gpudra/gpudra/pkg/webhook"

	"github.com/gpudra/gpudra/localcluster/manifests"
)

const (
	// webhookName is the name of the webhook in its configuration, which
	// the API server's refusals quote.
	webhookName = "opaque-configs.gpudra.io"
	// webhookNamespaceLabel selects the namespaces the webhook validates,
	// so that the other tests of the shared cluster never meet it.
	webhookNamespaceLabel = "gpudra.io/e2e-webhook"
)

// startWebhook runs `gpudra webhook`'s server in process on a loopback
// port with a self-signed certificate, registers it with the local
// cluster's API server (matchPolicy Equivalent, failurePolicy Fail) for
// the namespaces labelled webhookNamespaceLabel, leaves the caBundle to the
// server's bootstrap, and waits until the API server calls it. All of it
// goes at the end of the test, the registration first.
func startWebhook(t *testing.T, ctx context.Context) {
	t.Helper()
	const configName = "gpudra-e2e-webhook"
	handler, err := webhook.NewHandler()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Made before the server's cleanup is registered, so removed after
	// the server stops.
	certDir := t.TempDir()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- webhook.Run(runCtx, l, webhook.Config{
			Handler:           handler,
			SelfSignedDir:     certDir,
			SelfSignedHosts:   []string{"127.0.0.1"},
			WebhookConfigName: configName,
			Client:            demo.Client(),
			CABundleInterval:  100 * time.Millisecond,
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	})

	var rules []admissionregistrationv1.RuleWithOperations
	for _, r := range webhook.Resources() {
		rules = append(rules, admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{r.Group}, APIVersions: []string{r.Version}, Resources: []string{r.Resource},
				Scope: ptr.To(admissionregistrationv1.AllScopes),
			},
		})
	}
	vwcs := demo.Client().AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: configName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: webhookName,
			// No caBundle: the server's self-signed bootstrap sets it.
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + l.Addr().String() + webhook.ValidatePath)},
			Rules:                   rules,
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{webhookNamespaceLabel: "true"}},
		}},
	}
	if _, err := vwcs.Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := vwcs.Delete(context.Background(), configName, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete ValidatingWebhookConfiguration: %v", err)
		}
	})

	// Ready when a dry run of a bad claim is refused by the webhook: the
	// caBundle is set and the API server has picked the configuration up.
	ns := webhookNamespace(t, ctx, "webhook-probe")
	probe := claimWithConfig("probe", misspeltGpuConfig)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := demo.Client().ResourceV1().ResourceClaims(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), `admission webhook "`+webhookName+`" denied the request`), nil
	})
	if err != nil {
		t.Fatalf("the API server never called the webhook: %v", err)
	}
}

// webhookNamespace creates a namespace the webhook validates; it goes at
// the end of the test.
func webhookNamespace(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{webhookNamespaceLabel: "true"}}}
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
	_, err := config.DecodeParameters([]byte(params), config.ValidationFeatures)
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
	startWebhook(t, ctx)
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
	// Where the webhook is not registered (a namespace it does not select)
	// the same claim is created, to be refused only at Prepare.
	plain := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "webhook-unselected"}}
	if _, err := demo.Client().CoreV1().Namespaces().Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = demo.Client().CoreV1().Namespaces().Delete(context.Background(), plain.Name, metav1.DeleteOptions{})
	})
	if _, err := demo.Client().ResourceV1().ResourceClaims(plain.Name).Create(ctx, claimWithConfig("misspelt", misspeltGpuConfig), metav1.CreateOptions{}); err != nil {
		t.Errorf("claim with a misspelt field where the webhook is not registered: %v", err)
	}
	// A config of another driver is not the webhook's business.
	other := claimWithConfig("other-driver", misspeltGpuConfig)
	other.Spec.Devices.Config[0].Opaque.Driver = "nic.example.com"
	if _, err := demo.Client().ResourceV1().ResourceClaims(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Errorf("claim with a config of another driver: %v", err)
	}

	// A DeviceClass (cluster-scoped: the namespace selector does not
	// apply) with a bad config is refused too; it is never created.
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
