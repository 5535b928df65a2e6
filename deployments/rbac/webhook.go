package rbac

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// WebhookName is the name of the webhook's ServiceAccount, ClusterRole and
// ClusterRoleBinding.
const WebhookName = "gpudra-webhook"

// DefaultWebhookConfigName is the ValidatingWebhookConfiguration the
// webhook's ClusterRole names, gpudra webhook's --webhook-config-name
// default.
const DefaultWebhookConfigName = "gpudra-webhook"

// The files holding the webhook's objects.
const (
	webhookServiceAccountFile     = "webhook-serviceaccount.yaml"
	webhookClusterRoleFile        = "webhook-clusterrole.yaml"
	webhookClusterRoleBindingFile = "webhook-clusterrolebinding.yaml"
)

// WebhookObjects are the RBAC objects of the webhook.
type WebhookObjects struct {
	ServiceAccount     *corev1.ServiceAccount
	ClusterRole        *rbacv1.ClusterRole
	ClusterRoleBinding *rbacv1.ClusterRoleBinding
}

// Webhook returns fresh copies of the webhook's RBAC objects for a webhook
// whose pods run in namespace and whose self-signed bootstrap keeps the
// caBundle of the ValidatingWebhookConfiguration webhookConfigName; an
// empty argument keeps the default.
func Webhook(namespace, webhookConfigName string) (*WebhookObjects, error) {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	if webhookConfigName == "" {
		webhookConfigName = DefaultWebhookConfigName
	}
	objs := &WebhookObjects{
		ServiceAccount:     &corev1.ServiceAccount{},
		ClusterRole:        &rbacv1.ClusterRole{},
		ClusterRoleBinding: &rbacv1.ClusterRoleBinding{},
	}
	for _, f := range []struct {
		name string
		into any
	}{
		{webhookServiceAccountFile, objs.ServiceAccount},
		{webhookClusterRoleFile, objs.ClusterRole},
		{webhookClusterRoleBindingFile, objs.ClusterRoleBinding},
	} {
		data, err := files.ReadFile(f.name)
		if err != nil {
			return nil, err
		}
		if err := yaml.UnmarshalStrict(data, f.into); err != nil {
			return nil, fmt.Errorf("RBAC file %s: %w", f.name, err)
		}
	}
	if err := objs.check(); err != nil {
		return nil, err
	}
	objs.ServiceAccount.Namespace = namespace
	objs.ClusterRoleBinding.Subjects[0].Namespace = namespace
	objs.ClusterRole.Rules[0].ResourceNames = []string{webhookConfigName}
	return objs, nil
}

// check makes sure the files say what the substitutions assume.
func (o *WebhookObjects) check() error {
	sa, role, binding := o.ServiceAccount, o.ClusterRole, o.ClusterRoleBinding
	if sa.Kind != "ServiceAccount" || role.Kind != "ClusterRole" || binding.Kind != "ClusterRoleBinding" {
		return fmt.Errorf("RBAC files %s, %s, %s hold %s, %s, %s", webhookServiceAccountFile, webhookClusterRoleFile, webhookClusterRoleBindingFile, sa.Kind, role.Kind, binding.Kind)
	}
	if sa.Namespace != DefaultNamespace {
		return fmt.Errorf("RBAC file %s: namespace %q, want the default %q", webhookServiceAccountFile, sa.Namespace, DefaultNamespace)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Kind != rbacv1.ServiceAccountKind || binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		return fmt.Errorf("RBAC file %s: want exactly the subject ServiceAccount %s/%s", webhookClusterRoleBindingFile, sa.Namespace, sa.Name)
	}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name {
		return fmt.Errorf("RBAC file %s: roleRef %s %s is not the ClusterRole %s", webhookClusterRoleBindingFile, binding.RoleRef.Kind, binding.RoleRef.Name, role.Name)
	}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"validatingwebhookconfigurations"}) || !slices.Equal(role.Rules[0].ResourceNames, []string{DefaultWebhookConfigName}) {
		return fmt.Errorf("RBAC file %s: want one rule, on validatingwebhookconfigurations named %s", webhookClusterRoleFile, DefaultWebhookConfigName)
	}
	return nil
}
