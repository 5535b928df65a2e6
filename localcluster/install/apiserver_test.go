package install

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/gpudra/gpudra/deployments/rbac"
	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// TestChartOnAPIServer installs every object of the default render into a
// real kube-apiserver (the local cluster's), which must accept each one,
// and shows that the ResourceSlice policy confines a kubelet plugin, as its
// ServiceAccount with the node name its pod's token carries, to its own
// node's slices of its own driver.
func TestChartOnAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminCfg, admin := startRBACAPIServer(ctx, t)

	// helm install --namespace gpudra --create-namespace.
	const namespace = "gpudra"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var objs []manifests.Object
	for _, o := range render(t, Options{Namespace: namespace}) {
		u, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{Object: u}
		obj.SetGroupVersionKind(o.GVK)
		objs = append(objs, manifests.Object{Unstructured: obj, Source: o.Template})
	}
	disc := discovery.NewDiscoveryClientForConfigOrDie(adminCfg)
	applier := &manifests.Applier{
		Client: dynamic.NewForConfigOrDie(adminCfg),
		Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)),
	}
	refused, err := applier.Apply(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refused {
		t.Errorf("the API server refused %s", r)
	}

	// The policy's CEL is type-checked by kube-controller-manager, which
	// the local control plane does not run; the refusals below show each
	// validation at work instead.
	policyName := "gpudra-resourceslices-own-node"

	plugin := func(node string) kubernetes.Interface {
		cfg := rest.CopyConfig(adminCfg)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + namespace + ":" + rbac.KubeletPluginName,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	slice := func(name, driver, node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver,
				NodeName: &node,
				Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices:  []resourceapi.Device{{Name: "gpu-0"}},
			},
		}
	}
	nodeA, nodeB := plugin("node-a"), plugin("node-b")

	// Bindings take effect a moment after they are created: wait until the
	// plugin of node-a is refused node-b's slice.
	var lastErr error
	err = clustertest.Poll(ctx, 30*time.Second, func() bool {
		_, lastErr = nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("probe-b", "gpu.nvidia.com", "node-b"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return lastErr != nil
	})
	if err != nil {
		t.Fatalf("the plugin of node-a may still write node-b's slices: %v", err)
	}
	if !apierrors.IsInvalid(lastErr) && !apierrors.IsForbidden(lastErr) || !strings.Contains(lastErr.Error(), policyName) {
		t.Fatalf("refused, but not by %s: %v", policyName, lastErr)
	}

	// Its own node's slice: allowed, from create to delete.
	own, err := nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("node-a-gpu", "gpu.nvidia.com", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the plugin of node-a may not create its own slice: %v", err)
	}
	own.Spec.Pool.Generation++
	if own, err = nodeA.ResourceV1().ResourceSlices().Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the plugin of node-a may not update its own slice: %v", err)
	}
	// Node-b's slice, written by node-b's plugin (allowed).
	other, err := nodeB.ResourceV1().ResourceSlices().Create(ctx, slice("node-b-gpu", "gpu.nvidia.com", "node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the plugin of node-b may not create its own slice: %v", err)
	}

	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"create node-b's slice", func() error {
			_, err := nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("evil", "gpu.nvidia.com", "node-b"), metav1.CreateOptions{})
			return err
		}, "the kubelet plugin on node node-a may not write the ResourceSlices of node node-b"},
		{"update node-b's slice", func() error {
			changed := other.DeepCopy()
			changed.Spec.Devices = append(changed.Spec.Devices, resourceapi.Device{Name: "gpu-1"})
			_, err := nodeA.ResourceV1().ResourceSlices().Update(ctx, changed, metav1.UpdateOptions{})
			return err
		}, "may not write the ResourceSlices of node node-b"},
		{"move its slice to node-b", func() error {
			moved := own.DeepCopy()
			nodeName := "node-b"
			moved.Spec.NodeName = &nodeName
			_, err := nodeA.ResourceV1().ResourceSlices().Update(ctx, moved, metav1.UpdateOptions{})
			return err
		}, ""}, // pool and node are immutable, or the policy refuses it
		{"delete node-b's slice", func() error {
			return nodeA.ResourceV1().ResourceSlices().Delete(ctx, other.Name, metav1.DeleteOptions{})
		}, "may not write the ResourceSlices of node node-b"},
		{"another driver's slice on its node", func() error {
			_, err := nodeA.ResourceV1().ResourceSlices().Create(ctx, slice("other-driver", "gpu.example.com", "node-a"), metav1.CreateOptions{})
			return err
		}, "may not write the ResourceSlices of driver gpu.example.com"},
		{"a token without a node", func() error {
			_, err := plugin("").ResourceV1().ResourceSlices().Create(ctx, slice("nowhere", "gpu.nvidia.com", "node-a"), metav1.CreateOptions{})
			return err
		}, "names no node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("allowed")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("refused with %v, want a message containing %q", err, tc.want)
			}
		})
	}

	// The policy binds only the plugin: an administrator still writes any
	// node's slices, and the plugin its own to the end.
	if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, slice("admin-b", "gpu.nvidia.com", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Errorf("an administrator may not create node-b's slice: %v", err)
	}
	if err := nodeA.ResourceV1().ResourceSlices().Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the plugin of node-a may not delete its own slice: %v", err)
	}

	// The webhook configuration the chart installs matches what the API
	// server stored (matchPolicy and rules survive defaulting).
	vwc, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "gpudra-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p := vwc.Webhooks[0].MatchPolicy; p == nil || *p != admissionv1.Equivalent {
		t.Errorf("stored matchPolicy %v", p)
	}
}

// startRBACAPIServer starts a control plane whose kube-apiserver
// authorizes with Node and RBAC, as a cluster's does, stopped when the
// test ends, and returns its admin's config and client. Short tests skip.
func startRBACAPIServer(ctx context.Context, t *testing.T) (*rest.Config, kubernetes.Interface) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{AuthorizationModes: []string{"Node", "RBAC"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	cfg := cp.RESTConfig("install-admin", 100, 200)
	return cfg, kubernetes.NewForConfigOrDie(cfg)
}
