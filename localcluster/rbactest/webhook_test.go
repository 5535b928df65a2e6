package rbactest

import (
	"bytes"
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/deployments/rbac"
	"github.com/gpudra/gpudra/pkg/webhook"

	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// TestWebhookSetsCABundle: with exactly the webhook's RBAC, its
// self-signed bootstrap sets the caBundle of its own
// ValidatingWebhookConfiguration, and may not touch another one.
func TestWebhookSetsCABundle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{AuthorizationModes: []string{"Node", "RBAC"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	}()
	admin := kubernetes.NewForConfigOrDie(cp.RESTConfig("rbactest-admin", 100, 200))

	const configName = "gpu-webhook" // not the default: the template must follow
	objs, err := rbac.Webhook(pluginNS, configName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pluginNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(pluginNS).Create(ctx, objs.ServiceAccount, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, objs.ClusterRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, objs.ClusterRoleBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{configName, "someone-elses"} {
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name:                    "opaque-configs.gpudra.io",
				ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: pluginNS, Name: "gpudra-webhook"}},
				SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
				AdmissionReviewVersions: []string{"v1"},
			}},
		}
		if _, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	cfg := cp.RESTConfig("gpudra-webhook", 100, 200)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + pluginNS + ":" + objs.ServiceAccount.Name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + pluginNS, "system:authenticated"},
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	caPEM, err := webhook.EnsureSelfSigned(t.TempDir(), []string{"gpudra-webhook." + pluginNS + ".svc"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := webhook.PatchCABundle(ctx, client, configName, caPEM); err != nil || !changed {
		t.Fatalf("set caBundle with the webhook's RBAC: changed %v, %v", changed, err)
	}
	got, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Webhooks[0].ClientConfig.CABundle, caPEM) {
		t.Error("caBundle not set")
	}
	if changed, err := webhook.PatchCABundle(ctx, client, configName, caPEM); err != nil || changed {
		t.Errorf("set caBundle again: changed %v, %v; want no change", changed, err)
	}
	if _, err := webhook.PatchCABundle(ctx, client, "someone-elses", caPEM); !apierrors.IsForbidden(err) {
		t.Errorf("caBundle of another configuration: %v, want forbidden", err)
	}
}
