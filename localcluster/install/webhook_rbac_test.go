package install

import (
	"bytes"
	"context"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	"github.com/gpudra/gpudra/pkg/webhook"
)

// TestWebhookRBACOnAPIServer: the self-signed webhook, as the chart's
// ServiceAccount with exactly the chart's ClusterRole and binding, sets the
// caBundle of the chart's ValidatingWebhookConfiguration (the requests
// gpudra webhook's bootstrap makes), and may not touch another one.
func TestWebhookRBACOnAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminCfg, admin := startRBACAPIServer(ctx, t)

	const namespace = "gpu-system" // not the default: the templates must follow
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objs := render(t, Options{Namespace: namespace})
	sa := find[*corev1.ServiceAccount](t, objs, "gpudra-webhook")
	role := find[*rbacv1.ClusterRole](t, objs, "gpudra-webhook")
	binding := find[*rbacv1.ClusterRoleBinding](t, objs, "gpudra-webhook")
	vwc := find[*admissionv1.ValidatingWebhookConfiguration](t, objs, "gpudra-webhook")
	if _, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vwcs := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := vwcs.Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := vwc.DeepCopy()
	other.Name = "someone-elses"
	if _, err := vwcs.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cfg := rest.CopyConfig(adminCfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + sa.Name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	caPEM, err := webhook.EnsureSelfSigned(t.TempDir(), []string{"gpudra-webhook." + namespace + ".svc"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// Bindings take effect a moment after they are created.
	var patchErr error
	err = clustertest.Poll(ctx, 30*time.Second, func() bool {
		_, patchErr = webhook.PatchCABundle(ctx, client, vwc.Name, caPEM)
		return patchErr == nil
	})
	if err != nil {
		t.Fatalf("the webhook may not set its caBundle: %v", patchErr)
	}
	got, err := vwcs.Get(ctx, vwc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range got.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, caPEM) {
			t.Errorf("webhook %s: caBundle not set", w.Name)
		}
	}
	if _, err := webhook.PatchCABundle(ctx, client, other.Name, caPEM); !apierrors.IsForbidden(err) {
		t.Errorf("caBundle of another configuration: %v, want forbidden", err)
	}
}
