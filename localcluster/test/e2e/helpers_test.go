package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// testContext bounds one test.
func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// apply creates the objects of a YAML text in the shared demo cluster.
func apply(t *testing.T, ctx context.Context, yamlText string) {
	t.Helper()
	applyIn(t, ctx, demo, yamlText)
}

// applyIn creates the objects of a YAML text in cluster c.
func applyIn(t *testing.T, ctx context.Context, c *cluster.Cluster, yamlText string) {
	t.Helper()
	objs, err := manifests.Parse([]byte(yamlText), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	applyObjects(t, ctx, c, objs)
}

// loadTestdata returns a Namespace ns and the objects of the files under
// testdata, each put in ns, in the order of creation. The files hold
// namespaced objects written without a namespace, so that one file serves
// every test that needs its objects, each test in a namespace of its own.
func loadTestdata(t *testing.T, ns string, files ...string) []manifests.Object {
	t.Helper()
	namespace, err := runtime.DefaultUnstructuredConverter.ToUnstructured(clustertest.Namespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	objs := []manifests.Object{{Unstructured: &unstructured.Unstructured{Object: namespace}, Source: t.Name()}}
	for _, f := range files {
		more, err := manifests.Load(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range more {
			if o.GetNamespace() != "" {
				t.Fatalf("%s: names namespace %s; testdata objects go in the test's", o.Source, o.GetNamespace())
			}
			o.SetNamespace(ns)
		}
		objs = append(objs, more...)
	}
	manifests.Sort(objs)
	return objs
}

// create creates typed objects in cluster c as apply does the objects of
// YAML (namespaces first, pods last); a refusal fails the test. The
// objects carry their apiVersion and kind, as clustertest's builders
// write them.
func create(t *testing.T, ctx context.Context, c *cluster.Cluster, objs ...runtime.Object) {
	t.Helper()
	var list []manifests.Object
	for _, o := range objs {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, manifests.Object{Unstructured: &unstructured.Unstructured{Object: m}, Source: t.Name()})
	}
	manifests.Sort(list)
	applyObjects(t, ctx, c, list)
}

// applyObjects creates objs in cluster c; a refusal fails the test.
func applyObjects(t *testing.T, ctx context.Context, c *cluster.Cluster, objs []manifests.Object) {
	t.Helper()
	refused, err := c.Apply(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refused {
		t.Errorf("refused: %s", r)
	}
	if len(refused) != 0 {
		t.FailNow()
	}
}

// getPod returns the current pod.
func getPod(t *testing.T, ctx context.Context, ns, name string) *corev1.Pod {
	t.Helper()
	pod, err := demo.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// waitForPod waits until cond holds for the pod in the demo cluster and
// returns it.
func waitForPod(t *testing.T, ctx context.Context, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return waitForPodIn(t, ctx, demo, ns, name, what, cond)
}

// waitForPodIn waits until cond holds for the pod in cluster c and returns
// it; the failure says the pod's last phase and reason.
func waitForPodIn(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := clustertest.Poll(ctx, 0, func() bool {
		p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return cond(p)
	})
	if err != nil {
		t.Fatalf("pod %s/%s never %s (phase %s, reason %q): %v", ns, name, what, phaseOf(pod), reasonOf(pod), err)
	}
	return pod
}

func phaseOf(p *corev1.Pod) corev1.PodPhase {
	if p == nil {
		return "<none>"
	}
	return p.Status.Phase
}

func reasonOf(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return cluster.PodReason(p)
}

func running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

// devicesOf returns the devices allocated to the pod's claims, with the
// attributes the plugin published for them.
func devicesOf(t *testing.T, ctx context.Context, pod *corev1.Pod) []resourceapi.Device {
	t.Helper()
	devs, err := demo.AllocatedDevices(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

func attr(d resourceapi.Device, name string) string {
	text, _ := devicemodel.AttributeText(d.Attributes[resourceapi.QualifiedName(name)])
	return text
}

// claimUIDs returns the UIDs of the pod's claims.
func claimUIDs(t *testing.T, ctx context.Context, pod *corev1.Pod) []string {
	t.Helper()
	var uids []string
	for _, name := range cluster.ClaimNames(pod) {
		claim, err := demo.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids = append(uids, string(claim.UID))
	}
	return uids
}

// specFilesFor lists the node's CDI spec files that mention the claim.
func specFilesFor(t *testing.T, node, claimUID string) []string {
	t.Helper()
	entries, err := os.ReadDir(demo.Node(node).CDIDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.Contains(e.Name(), claimUID) {
			out = append(out, e.Name())
		}
	}
	return out
}

// checkpointHas reports whether the node's plugin checkpoint holds the
// claim.
func checkpointHas(t *testing.T, node, claimUID string) bool {
	t.Helper()
	st, err := demo.Node(node).Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	return st.Claims[claimUID] != nil
}

// asksForExtendedGPUs reports whether a container asks for GPUs as an
// extended resource: nvidia.com/gpu, or a DeviceClass's implicit name.
func asksForExtendedGPUs(c *corev1.Container) bool {
	for name := range c.Resources.Limits {
		if name == "nvidia.com/gpu" || strings.HasPrefix(string(name), "nvidia.com/mig-") || strings.HasPrefix(string(name), "deviceclass.resource.kubernetes.io/") {
			return true
		}
	}
	return false
}

// checkContainersSeeDevices checks that every container with claims got
// CDI devices that resolve to device nodes: each allocated GPU's
// /dev/nvidia<minor>, for MIG devices a GPU node and MIG capability
// nodes (MIG devices do not publish their parent's minor), for a NIC of
// the simulated NIC driver an RDMA uverbs node.
func checkContainersSeeDevices(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
	t.Helper()
	ctrs, ok := demo.SimNode(pod.Spec.NodeName).Containers(pod)
	if !ok {
		t.Errorf("%s: node %s has no container record", pod.Name, pod.Spec.NodeName)
		return
	}
	gpuNode := regexp.MustCompile(`^/dev/nvidia[0-9]+$`)
	for _, c := range pod.Spec.Containers {
		if len(c.Resources.Claims) == 0 && !asksForExtendedGPUs(&c) {
			continue
		}
		got := ctrs[c.Name]
		if len(got.CDIDevices) == 0 {
			t.Errorf("%s/%s: no CDI devices", pod.Name, c.Name)
		}
		for _, d := range devs {
			switch attr(d, "type") {
			case "gpu":
				node := "/dev/nvidia" + attr(d, "minor")
				if !slices.Contains(got.DeviceNodes, node) {
					t.Errorf("%s/%s: device %s: %s not among the device nodes %v", pod.Name, c.Name, d.Name, node, got.DeviceNodes)
				}
			case "mig":
				caps := slices.ContainsFunc(got.DeviceNodes, func(n string) bool { return strings.HasPrefix(n, "/dev/nvidia-caps/") })
				gpu := slices.ContainsFunc(got.DeviceNodes, gpuNode.MatchString)
				if !caps || !gpu {
					t.Errorf("%s/%s: MIG device %s: device nodes %v lack a GPU node or MIG capabilities", pod.Name, c.Name, d.Name, got.DeviceNodes)
				}
			case "nic":
				if !slices.ContainsFunc(got.DeviceNodes, func(n string) bool { return strings.HasPrefix(n, "/dev/infiniband/uverbs") }) {
					t.Errorf("%s/%s: NIC %s: device nodes %v lack a uverbs node", pod.Name, c.Name, d.Name, got.DeviceNodes)
				}
			case "vfio":
				vfio := slices.ContainsFunc(got.DeviceNodes, func(n string) bool { return strings.HasPrefix(n, "/dev/vfio/") })
				nvidia := slices.ContainsFunc(got.DeviceNodes, func(n string) bool { return strings.HasPrefix(n, "/dev/nvidia") })
				if !vfio || nvidia {
					t.Errorf("%s/%s: VFIO device %s: device nodes %v, want VFIO nodes and no NVIDIA driver node", pod.Name, c.Name, d.Name, got.DeviceNodes)
				}
			}
		}
	}
}

// startFleet starts a cluster of the test's own on the fleet that
// fleetYAML describes (name is the fleet's, for messages), in a short
// temporary directory ([clustertest.ShortTempDir]: the nodes' plugin
// sockets lie below it), and stops it at the test's end (cleanups the
// caller registered before run after the stop). opts.Fleet and opts.Dir
// are set here.
func startFleet(t *testing.T, ctx context.Context, name, fleetYAML string, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	fleet, err := simfleet.Parse([]byte(fleetYAML), name)
	if err != nil {
		t.Fatal(err)
	}
	opts.Fleet = fleet
	opts.Dir = clustertest.ShortTempDir(t)
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// useAsDemo points the helpers that act on the demo cluster at c until the
// test ends.
func useAsDemo(t *testing.T, c *cluster.Cluster) {
	saved := demo
	demo = c
	t.Cleanup(func() { demo = saved })
}

// withoutMetadata drops the CDI devices of DRA device metadata (KEP-5304)
// from a container's: a DRA claim's container gets one beside the claim's
// own, a device plugin's none.
func withoutMetadata(ids []string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return strings.Contains(id, "/metadata=") })
}
