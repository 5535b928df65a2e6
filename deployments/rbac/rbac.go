// Package rbac holds the RBAC of gpudra's kubelet plugin: its
// ServiceAccount, a ClusterRole with every permission the plugin uses, and
// the ClusterRoleBinding between them. The YAML files in this directory are
// the one source of truth, embedded here for the local cluster and the
// tests, and copied into the Helm chart as
// deployments/helm/gpudra/files/rbac (make chart-files).
//
// The files name the defaults: namespace gpudra and driver name
// gpu.nvidia.com. Those two values are templates; [KubeletPlugin] replaces
// them, and so must any other tool that installs gpudra elsewhere or under
// another driver name.
package rbac

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

//go:embed *.yaml
var files embed.FS

// Defaults the YAML files are written for.
const (
	DefaultNamespace  = "gpudra"
	DefaultDriverName = v1beta1.GPUDriverName
)

// KubeletPluginName is the name of the kubelet plugin's ServiceAccount,
// ClusterRole and ClusterRoleBinding.
const KubeletPluginName = "gpudra-kubelet-plugin"

// The files holding the kubelet plugin's objects.
const (
	serviceAccountFile     = "kubelet-plugin-serviceaccount.yaml"
	clusterRoleFile        = "kubelet-plugin-clusterrole.yaml"
	clusterRoleBindingFile = "kubelet-plugin-clusterrolebinding.yaml"
)

// KubeletPluginObjects are the RBAC objects of the kubelet plugin.
type KubeletPluginObjects struct {
	ServiceAccount     *corev1.ServiceAccount
	ClusterRole        *rbacv1.ClusterRole
	ClusterRoleBinding *rbacv1.ClusterRoleBinding
}

// KubeletPlugin returns fresh copies of the kubelet plugin's RBAC objects
// for a plugin whose pods run in namespace and serve driverName; an empty
// argument keeps the default. The ServiceAccount and the binding's subject
// get the namespace; the per-driver device-status rule gets the driver name.
func KubeletPlugin(namespace, driverName string) (*KubeletPluginObjects, error) {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	if driverName == "" {
		driverName = DefaultDriverName
	}
	objs := &KubeletPluginObjects{
		ServiceAccount:     &corev1.ServiceAccount{},
		ClusterRole:        &rbacv1.ClusterRole{},
		ClusterRoleBinding: &rbacv1.ClusterRoleBinding{},
	}
	for _, f := range []struct {
		name string
		into any
	}{
		{serviceAccountFile, objs.ServiceAccount},
		{clusterRoleFile, objs.ClusterRole},
		{clusterRoleBindingFile, objs.ClusterRoleBinding},
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
	for i := range objs.ClusterRole.Rules {
		rule := &objs.ClusterRole.Rules[i]
		if slices.Contains(rule.Resources, "resourceclaims/driver") {
			rule.ResourceNames = []string{driverName}
		}
	}
	return objs, nil
}

// check makes sure the files say what the substitutions assume, so that an
// edit of a file cannot silently leave a default in place.
func (o *KubeletPluginObjects) check() error {
	for _, c := range []struct {
		file, apiVersion, kind string
		gotAPIVersion, gotKind string
	}{
		{serviceAccountFile, "v1", "ServiceAccount", o.ServiceAccount.APIVersion, o.ServiceAccount.Kind},
		{clusterRoleFile, "rbac.authorization.k8s.io/v1", "ClusterRole", o.ClusterRole.APIVersion, o.ClusterRole.Kind},
		{clusterRoleBindingFile, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", o.ClusterRoleBinding.APIVersion, o.ClusterRoleBinding.Kind},
	} {
		if c.gotAPIVersion != c.apiVersion || c.gotKind != c.kind {
			return fmt.Errorf("RBAC file %s holds %s %s, want %s %s", c.file, c.gotAPIVersion, c.gotKind, c.apiVersion, c.kind)
		}
	}
	sa, binding := o.ServiceAccount, o.ClusterRoleBinding
	if sa.Namespace != DefaultNamespace {
		return fmt.Errorf("RBAC file %s: namespace %q, want the default %q", serviceAccountFile, sa.Namespace, DefaultNamespace)
	}
	if len(binding.Subjects) != 1 {
		return fmt.Errorf("RBAC file %s: want exactly one subject, got %d", clusterRoleBindingFile, len(binding.Subjects))
	}
	subject := binding.Subjects[0]
	if subject.Kind != rbacv1.ServiceAccountKind || subject.Name != sa.Name || subject.Namespace != sa.Namespace {
		return fmt.Errorf("RBAC file %s: subject %s %s/%s is not the ServiceAccount %s/%s", clusterRoleBindingFile, subject.Kind, subject.Namespace, subject.Name, sa.Namespace, sa.Name)
	}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != o.ClusterRole.Name {
		return fmt.Errorf("RBAC file %s: roleRef %s %s is not the ClusterRole %s", clusterRoleBindingFile, binding.RoleRef.Kind, binding.RoleRef.Name, o.ClusterRole.Name)
	}
	driverRules := 0
	for _, rule := range o.ClusterRole.Rules {
		if slices.Contains(rule.Resources, "resourceclaims/driver") {
			driverRules++
			if len(rule.Resources) != 1 || !slices.Equal(rule.ResourceNames, []string{DefaultDriverName}) {
				return fmt.Errorf("RBAC file %s: the resourceclaims/driver rule must stand alone and name only %s", clusterRoleFile, DefaultDriverName)
			}
		}
	}
	if driverRules != 1 {
		return fmt.Errorf("RBAC file %s: want one resourceclaims/driver rule, got %d", clusterRoleFile, driverRules)
	}
	return nil
}

// Files returns the YAML files, by file name, for tools that apply them
// as they are.
func Files() fs.FS { return files }
