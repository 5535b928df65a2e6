package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/install"
	"github.com/gpudra/gpudra/localcluster/simnode"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// TestChartInstalled: the demo cluster is gpudra's chart, installed: its
// DeviceClasses, RBAC, ResourceSlice policy and webhook registration are
// in the API server.
func TestChartInstalled(t *testing.T) {
	ctx := testContext(t, time.Minute)
	r := demo.Release()
	if r == nil {
		t.Fatal("the demo cluster was not installed from the chart")
	}
	client := demo.Client()
	for _, o := range r.Objects {
		var err error
		switch o.Kind {
		case "DeviceClass":
			_, err = client.ResourceV1().DeviceClasses().Get(ctx, o.Name, metav1.GetOptions{})
		case "ClusterRole":
			_, err = client.RbacV1().ClusterRoles().Get(ctx, o.Name, metav1.GetOptions{})
		case "ServiceAccount":
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
		case "ValidatingAdmissionPolicy":
			_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, o.Name, metav1.GetOptions{})
		case "ValidatingWebhookConfiguration":
			_, err = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, o.Name, metav1.GetOptions{})
		case "DaemonSet", "Deployment":
			continue // run in process, not applied
		}
		if err != nil {
			t.Errorf("%s: %v", o, err)
		}
	}
}

// pluginIdentity returns a client that authenticates as node's kubelet
// plugin does: the chart's DaemonSet's ServiceAccount, with the node its
// pod-bound token names.
func pluginIdentity(c *cluster.Cluster, node string) kubernetes.Interface {
	pod := c.Release().KubeletPlugin
	cfg := c.ControlPlane().RESTConfig("e2e-plugin-identity", 50, 100)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + pod.Namespace + ":" + pod.ServiceAccount(),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + pod.Namespace, "system:authenticated"},
		Extra:    map[string][]string{"authentication.kubernetes.io/node-name": {node}},
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

// TestChartPolicyRefusesOtherNodesSlices: a kubelet plugin whose node is A
// may not create, update or delete node B's ResourceSlices, by the chart's
// ValidatingAdmissionPolicy and with its message, while it may its own.
func TestChartPolicyRefusesOtherNodesSlices(t *testing.T) {
	ctx := testContext(t, time.Minute)
	nodes := demo.SimNodes()
	if len(nodes) < 2 {
		t.Fatalf("the demo fleet has %d nodes", len(nodes))
	}
	a, b := nodes[0].Name(), nodes[1].Name()
	pluginA := pluginIdentity(demo, a)
	want := fmt.Sprintf("the kubelet plugin on node %s may not write the ResourceSlices of node %s", a, b)

	// gpudra's own slices: the nodes also publish the simulated NIC
	// driver's, which the policy keeps from gpudra's plugin as another
	// driver's.
	gpudraSlices := func(node string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + demo.Options().DriverName}
	}
	list, err := demo.Client().ResourceV1().ResourceSlices().List(ctx, gpudraSlices(b))
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("node %s's slices: %v, %d", b, err, len(list.Items))
	}
	sliceB := list.Items[0]

	newSlice := sliceB.DeepCopy()
	newSlice.ObjectMeta = metav1.ObjectMeta{Name: "e2e-policy-" + b}
	_, err = pluginA.ResourceV1().ResourceSlices().Create(ctx, newSlice, metav1.CreateOptions{})
	checkRefused(t, "create node B's slice", err, want)

	changed := sliceB.DeepCopy()
	changed.Labels = map[string]string{"e2e": "changed-by-another-node"}
	_, err = pluginA.ResourceV1().ResourceSlices().Update(ctx, changed, metav1.UpdateOptions{})
	checkRefused(t, "update node B's slice", err, want)

	err = pluginA.ResourceV1().ResourceSlices().Delete(ctx, sliceB.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	checkRefused(t, "delete node B's slice", err, want)

	// Its own node's slice: the same write is allowed (a dry run, so as
	// not to disturb the plugin's own slices).
	own, err := demo.Client().ResourceV1().ResourceSlices().List(ctx, gpudraSlices(a))
	if err != nil || len(own.Items) == 0 {
		t.Fatalf("node %s's slices: %v", a, err)
	}
	if _, err := pluginA.ResourceV1().ResourceSlices().Update(ctx, &own.Items[0], metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("node %s's plugin may not update its own slice: %v", a, err)
	}
}

func checkRefused(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: allowed", what)
	case !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "gpudra-resourceslices-own-node"):
		t.Errorf("%s: refused with %v, want the policy gpudra-resourceslices-own-node's %q", what, err, want)
	default:
		t.Logf("%s: %v", what, err)
	}
}

// TestChartRBACIsAllThePluginHas: in a cluster whose chart-rendered
// ClusterRole lacks one verb the kubelet plugin needs (get on
// resourceclaims, which the kubeletplugin helper calls for every claim it
// prepares), a pod's claim fails at Prepare with the API server's
// refusal of the chart's ServiceAccount; given the verb back, the same
// pod starts. The plugin has no permission of its own beside the chart's.
func TestChartRBACIsAllThePluginHas(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet, BeforeChart: func(r *install.Release) error {
		for _, o := range r.Objects {
			cr, ok := o.Object.(*rbacv1.ClusterRole)
			if !ok || cr.Name != r.KubeletPlugin.ServiceAccount() {
				continue
			}
			for i, rule := range cr.Rules {
				if slices.Contains(rule.Resources, "resourceclaims") {
					cr.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == "get" })
				}
			}
			role = cr
		}
		if role == nil {
			return fmt.Errorf("no ClusterRole %s in the chart", r.KubeletPlugin.ServiceAccount())
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	client := c.Client()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "one-gpu"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}},
		}}},
	}
	if _, err := client.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: "trainer", Annotations: map[string]string{simnode.RunForAnnotation: "1h"}},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "ctr", Image: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
		},
	}
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + c.Release().Namespace + ":" + c.Release().KubeletPlugin.ServiceAccount()
	want := `User "` + user + `" cannot get resource "resourceclaims"`
	var last string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = cluster.PodReason(p)
		if p.Status.Phase == corev1.PodRunning {
			return false, fmt.Errorf("the pod runs although the plugin may not get its claim")
		}
		return strings.Contains(last, want), nil
	})
	if err != nil {
		t.Fatalf("the pod's claim was not refused for the missing verb (want %q, pod says %q): %v", want, last, err)
	}
	t.Logf("without get on resourceclaims: %s", last)

	// The verb back: the kubelet retries Prepare and the pod starts.
	cr, err := client.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, rule := range cr.Rules {
		if slices.Contains(rule.Resources, "resourceclaims") {
			cr.Rules[i].Verbs = append(cr.Rules[i].Verbs, "get")
		}
	}
	if _, err := client.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = clustertest.Poll(ctx, 2*time.Minute, func() bool {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	if err != nil {
		t.Fatalf("with the verb back the pod did not start: %v", err)
	}
}
