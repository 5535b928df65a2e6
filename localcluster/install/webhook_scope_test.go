package install

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// opaque is a config of driver for every request.
func opaque(driver string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: driver, Parameters: kruntime.RawExtension{Raw: []byte(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`)},
	}}}
}

// claimSpec asks for one device of class, configured by configs of drivers.
func claimSpec(class string, drivers ...string) resourceapi.ResourceClaimSpec {
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
	}}
	for _, d := range drivers {
		spec.Devices.Config = append(spec.Devices.Config, opaque(d))
	}
	return spec
}

// TestWebhookScopeOnAPIServer installs the chart's webhook configuration
// and Service into a real kube-apiserver with no webhook pod behind them,
// so that every call to the webhook fails and failurePolicy Fail refuses
// what is sent to it. The API server compiles the match conditions, and
// only objects with a config of gpudra's drivers, created or with their
// spec changed, are refused: another driver's claims, templates and
// classes, and a metadata update of a gpudra claim, are admitted while the
// webhook is down.
func TestWebhookScopeOnAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, admin := startRBACAPIServer(ctx, t)
	const namespace, team = "gpudra", "team"
	for _, ns := range []string{namespace, team} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claims := admin.ResourceV1().ResourceClaims(team)
	templates := admin.ResourceV1().ResourceClaimTemplates(team)
	classes := admin.ResourceV1().DeviceClasses()

	// A claim of gpudra's from before the webhook, which the resource
	// claim controller will update (its finalizer) while the webhook is
	// down.
	early, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "early"}, Spec: claimSpec("gpu.nvidia.com", "gpu.nvidia.com")}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	earlyClass, err := classes.Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "early.example.com"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	objs := render(t, Options{Namespace: namespace})
	svc := find[*corev1.Service](t, objs, "gpudra-webhook")
	if _, err := admin.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vwc := find[*admissionv1.ValidatingWebhookConfiguration](t, objs, "gpudra-webhook")
	if _, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server refused the webhook configuration: %v", err)
	}

	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	gpudraClaim := func() error {
		_, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: claimSpec("gpu.nvidia.com", "gpu.nvidia.com")}, dryRun)
		return err
	}
	// The configuration takes effect a moment after it is created.
	if err := clustertest.Poll(ctx, 30*time.Second, func() bool {
		return gpudraClaim() != nil
	}); err != nil {
		t.Fatalf("the API server never called the webhook: %v", err)
	}

	for _, tc := range []struct {
		name string
		call func() error
		// sent: the API server calls the webhook, which fails.
		sent bool
	}{
		{"claim of gpudra's driver", gpudraClaim, true},
		{"claim of another driver", func() error {
			_, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: claimSpec("gpu.example.com", "gpu.example.com")}, dryRun)
			return err
		}, false},
		{"claim without configs", func() error {
			_, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: claimSpec("gpu.nvidia.com")}, dryRun)
			return err
		}, false},
		{"claim with another driver's and gpudra's configs", func() error {
			_, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "both"}, Spec: claimSpec("gpu.nvidia.com", "gpu.example.com", "gpu.nvidia.com")}, dryRun)
			return err
		}, true},
		{"template of the ComputeDomain driver", func() error {
			_, err := templates.Create(ctx, &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "channel"},
				Spec: resourceapi.ResourceClaimTemplateSpec{Spec: claimSpec("compute-domain-default-channel.nvidia.com", "compute-domain.nvidia.com")}}, dryRun)
			return err
		}, true},
		{"template of another driver", func() error {
			_, err := templates.Create(ctx, &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "other"},
				Spec: resourceapi.ResourceClaimTemplateSpec{Spec: claimSpec("gpu.example.com", "gpu.example.com")}}, dryRun)
			return err
		}, false},
		{"class with a gpudra config", func() error {
			_, err := classes.Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "tuned.nvidia.com"},
				Spec: resourceapi.DeviceClassSpec{Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: opaque("gpu.nvidia.com").DeviceConfiguration}}}}, dryRun)
			return err
		}, true},
		{"class of another driver", func() error {
			_, err := classes.Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"},
				Spec: resourceapi.DeviceClassSpec{Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: opaque("gpu.example.com").DeviceConfiguration}}}}, dryRun)
			return err
		}, false},
		{"class given a gpudra config", func() error {
			c := earlyClass.DeepCopy()
			c.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: opaque("gpu.nvidia.com").DeviceConfiguration}}
			_, err := classes.Update(ctx, c, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, true},
		{"finalizer on a gpudra claim", func() error {
			c := early.DeepCopy()
			c.Finalizers = append(c.Finalizers, "resource.kubernetes.io/delete-protection")
			_, err := claims.Update(ctx, c, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			switch {
			case tc.sent && (err == nil || !strings.Contains(err.Error(), "failed calling webhook")):
				t.Errorf("got %v, want the webhook called (and failing)", err)
			case !tc.sent && err != nil:
				t.Errorf("refused while the webhook is down: %v", err)
			}
		})
	}
}

// TestWebhookScopeRender checks which drivers' configs the match condition
// sends to the webhook, and the PodDisruptionBudget of a webhook with more
// than one replica (which needs a certificate Secret: self-signed replicas
// are refused, see TestTemplateRefusals).
func TestWebhookScopeRender(t *testing.T) {
	for _, tc := range []struct {
		name        string
		values      map[string]any
		drivers     []string
		notDrivers  []string
		pdbReplicas int32
	}{
		{name: "defaults", drivers: []string{"'gpu.nvidia.com'", "'compute-domain.nvidia.com'"}},
		{name: "ComputeDomains off", values: values("computeDomains.enabled", false),
			drivers: []string{"'gpu.nvidia.com'"}, notDrivers: []string{"compute-domain.nvidia.com"}},
		{name: "other driver names", values: values("driverName", "gpu.gpudra.example.com", "computeDomains.driverName", "cd.gpudra.example.com"),
			drivers: []string{"'gpu.gpudra.example.com'", "'cd.gpudra.example.com'"}, notDrivers: []string{"nvidia.com"}},
		{name: "two replicas with a certificate Secret",
			values:  values("webhook.replicas", 2, "webhook.tls.mode", "secret", "webhook.tls.secretName", "tls", "webhook.tls.caBundle", "Y2E="),
			drivers: []string{"'gpu.nvidia.com'"}, pdbReplicas: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, Options{Values: tc.values})
			vwc := find[*admissionv1.ValidatingWebhookConfiguration](t, objs, "gpudra-webhook")
			var expr string
			for _, c := range vwc.Webhooks[0].MatchConditions {
				expr += c.Expression + "\n"
			}
			for _, d := range tc.drivers {
				if !strings.Contains(expr, d) {
					t.Errorf("match conditions do not send configs of %s:\n%s", d, expr)
				}
			}
			for _, d := range tc.notDrivers {
				if strings.Contains(expr, d) {
					t.Errorf("match conditions send configs of %s:\n%s", d, expr)
				}
			}
			if pdbs := all[*policyv1.PodDisruptionBudget](objs); tc.pdbReplicas == 0 {
				if len(pdbs) != 0 {
					t.Errorf("a PodDisruptionBudget for one replica would block every drain: %+v", pdbs)
				}
				return
			}
			dep := find[*appsv1.Deployment](t, objs, "gpudra-webhook")
			pdb := find[*policyv1.PodDisruptionBudget](t, objs, "gpudra-webhook")
			if *dep.Spec.Replicas != tc.pdbReplicas || pdb.Namespace != dep.Namespace ||
				pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) ||
				pdb.Spec.Selector == nil || !maps.Equal(pdb.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels) {
				t.Errorf("PodDisruptionBudget %+v for Deployment %+v", pdb.Spec, dep.Spec.Selector)
			}
		})
	}
}
