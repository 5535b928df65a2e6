package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"

	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// TestExamples applies every example at once, as gpudra-sim does, waits
// until the pods settle, and checks that each lands on the kind of device
// it asks for and that its containers get those devices through CDI.
func TestExamples(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	objs, err := manifests.Load(examplesDir())
	if err != nil {
		t.Fatal(err)
	}
	if refused, err := demo.Apply(ctx, objs); err != nil || len(refused) != 0 {
		t.Fatalf("apply the examples: refused %v, error %v", refused, err)
	}
	// The examples hold most of the demo fleet's GPUs; the tests after
	// this one need some, so the examples go once checked.
	t.Cleanup(func() { deleteNamespaces(t, objs) })
	if err := demo.WaitSettled(ctx, 2*time.Second); err != nil {
		t.Fatalf("pods did not settle: %v", err)
	}

	type check func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device)
	isType := func(typ string, n int) check {
		return func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
			if len(devs) != n {
				t.Fatalf("got %d devices, want %d", len(devs), n)
			}
			for _, d := range devs {
				if got := attr(d, "type"); got != typ {
					t.Errorf("device %s has type %q, want %q", d.Name, got, typ)
				}
			}
		}
	}
	product := func(prefix string) check {
		return func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
			for _, d := range devs {
				if got := attr(d, "productName"); !strings.HasPrefix(got, prefix) {
					t.Errorf("device %s is a %q, want %s*", d.Name, got, prefix)
				}
			}
		}
	}
	// A pod that asks for nvidia.com/gpu (or a class's implicit extended
	// resource) has no claims in its spec: the scheduler made one for it,
	// named in its status, allocated from gpudra's slices.
	extendedClaim := func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
		s := pod.Status.ExtendedResourceClaimStatus
		if s == nil || s.ResourceClaimName == "" || len(s.RequestMappings) == 0 {
			t.Fatalf("no extendedResourceClaimStatus: %+v", s)
		}
		claim, err := demo.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != len(devs) || claim.Status.Allocation.Devices.Results[0].Driver != "gpu.nvidia.com" {
			t.Errorf("claim %s allocation %+v", claim.Name, claim.Status.Allocation)
		}
	}
	tests := []struct {
		ns, pod string
		checks  []check
	}{
		{"single-gpu", "pod", []check{isType("gpu", 1)}},
		{"two-pods-distinct-gpus", "pod0", []check{isType("gpu", 1)}},
		{"two-pods-distinct-gpus", "pod1", []check{isType("gpu", 1)}},
		{"shared-claim", "pod", []check{isType("gpu", 1), func(t *testing.T, pod *corev1.Pod, _ []resourceapi.Device) {
			ctrs, _ := demo.SimNode(pod.Spec.NodeName).Containers(pod)
			if a, b := ctrs["ctr0"].CDIDevices, ctrs["ctr1"].CDIDevices; len(a) == 0 || !slices.Equal(a, b) {
				t.Errorf("containers do not share the claim's devices: ctr0 %v, ctr1 %v", a, b)
			}
		}}},
		{"cel-selection", "by-product-name", []check{isType("gpu", 1), product("NVIDIA A100-SXM4-40GB")}},
		{"cel-selection", "by-memory", []check{isType("gpu", 1), func(t *testing.T, _ *corev1.Pod, devs []resourceapi.Device) {
			for _, d := range devs {
				mem := d.Capacity["memory"].Value
				if mem.Cmp(resource.MustParse("79Gi")) < 0 {
					t.Errorf("device %s has %s memory, want >= 79Gi", d.Name, mem.String())
				}
			}
		}}},
		{"pcie-root-pair", "pod", []check{isType("gpu", 2), func(t *testing.T, _ *corev1.Pod, devs []resourceapi.Device) {
			a, b := attr(devs[0], "resource.kubernetes.io/pcieRoot"), attr(devs[1], "resource.kubernetes.io/pcieRoot")
			if a == "" || a != b {
				t.Errorf("devices %s and %s are under PCIe roots %q and %q", devs[0].Name, devs[1].Name, a, b)
			}
		}}},
		{"first-available", "pod", []check{isType("gpu", 1), product("NVIDIA H100")}},
		{"gpu-nic-pair", "pod", []check{func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
			if len(devs) != 2 {
				t.Fatalf("got %d devices, want a GPU and a NIC", len(devs))
			}
			byType := map[string]resourceapi.Device{}
			for _, d := range devs {
				byType[attr(d, "type")] = d
			}
			gpu, nic := byType["gpu"], byType["nic"]
			root := attr(gpu, "resource.kubernetes.io/pcieRoot")
			if root == "" || root != attr(nic, "resource.kubernetes.io/pcieRoot") {
				t.Errorf("GPU %s under %q and NIC %s under %q, want one PCIe root", gpu.Name, root, nic.Name, attr(nic, "resource.kubernetes.io/pcieRoot"))
			}
			ctrs, _ := demo.SimNode(pod.Spec.NodeName).Containers(pod)
			got := ctrs["ctr"]
			hca := attr(nic, "rdmaDevice")
			uverbs := "/dev/infiniband/uverbs" + strings.TrimPrefix(hca, "mlx5_")
			if !slices.Contains(got.DeviceNodes, "/dev/nvidia"+attr(gpu, "minor")) || !slices.Contains(got.DeviceNodes, uverbs) {
				t.Errorf("device nodes %v, want /dev/nvidia%s and %s", got.DeviceNodes, attr(gpu, "minor"), uverbs)
			}
			if env := got.Env["NCCL_IB_HCA"]; hca == "" || env != "="+hca {
				t.Errorf("NCCL_IB_HCA=%q, want =%s", env, hca)
			}
		}}},
		{"allocation-mode-all", "pod", []check{isType("mig", 7), func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
			for _, d := range devs {
				if p := attr(d, "profile"); p != "1g.5gb" {
					t.Errorf("device %s has profile %s", d.Name, p)
				}
			}
			if pod.Spec.NodeName != "dgx-a100-0" {
				t.Errorf("pod on %s, want dgx-a100-0 (the only node with 1g.5gb devices)", pod.Spec.NodeName)
			}
		}}},
		{"mig-profile", "pod", []check{isType("mig", 1), func(t *testing.T, _ *corev1.Pod, devs []resourceapi.Device) {
			if p := attr(devs[0], "profile"); p != "1g.10gb" {
				t.Errorf("device %s has profile %s, want 1g.10gb", devs[0].Name, p)
			}
		}}},
		{"gpu-config", "pod", []check{isType("gpu", 1)}},
		{"mps-sharing", "pod", []check{isType("gpu", 1), func(t *testing.T, pod *corev1.Pod, _ []resourceapi.Device) {
			ctrs, _ := demo.SimNode(pod.Spec.NodeName).Containers(pod)
			for _, name := range []string{"trainer", "evaluator"} {
				if got := ctrs[name].Env["CUDA_MPS_PIPE_DIRECTORY"]; got != "/tmp/nvidia-mps" {
					t.Errorf("container %s: CUDA_MPS_PIPE_DIRECTORY=%q, want /tmp/nvidia-mps", name, got)
				}
			}
		}}},
		{"vfio-passthrough", "vm", []check{isType("vfio", 1), func(t *testing.T, pod *corev1.Pod, _ []resourceapi.Device) {
			ctrs, _ := demo.SimNode(pod.Spec.NodeName).Containers(pod)
			nodes := ctrs["launcher"].DeviceNodes
			if !slices.Contains(nodes, "/dev/iommu") || !slices.ContainsFunc(nodes, func(p string) bool { return strings.HasPrefix(p, "/dev/vfio/devices/vfio") }) {
				t.Errorf("VFIO container's nodes %v, want /dev/iommu and /dev/vfio/devices/vfioN", nodes)
			}
		}}},
		{"extended-resources", "gpu-by-class", []check{isType("gpu", 1), extendedClaim}},
		{"extended-resources", "mig-by-extended-resource", []check{isType("mig", 1), extendedClaim, func(t *testing.T, _ *corev1.Pod, devs []resourceapi.Device) {
			if p := attr(devs[0], "profile"); p != "1g.10gb" {
				t.Errorf("device %s has profile %s, want 1g.10gb", devs[0].Name, p)
			}
		}}},
		{"mig-dynamic", "pod", []check{isType("mig", 2), func(t *testing.T, pod *corev1.Pod, devs []resourceapi.Device) {
			if pod.Spec.NodeName != "dgx-h100-1" || attr(devs[0], "parentUUID") != attr(devs[1], "parentUUID") {
				t.Errorf("devices %s and %s on %s, want two of one GPU on dgx-h100-1", devs[0].Name, devs[1].Name, pod.Spec.NodeName)
			}
			profiles := []string{attr(devs[0], "profile"), attr(devs[1], "profile")}
			slices.Sort(profiles)
			if !slices.Equal(profiles, []string{"1g.20gb", "4g.40gb"}) {
				t.Errorf("profiles %v, want 1g.20gb and 4g.40gb", profiles)
			}
		}}},
	}
	seen := map[string]string{}
	for _, tc := range tests {
		t.Run(tc.ns+"/"+tc.pod, func(t *testing.T) {
			pod := getPod(t, ctx, tc.ns, tc.pod)
			if pod.Status.Phase != corev1.PodRunning {
				t.Fatalf("phase %s, want Running; reason: %s", pod.Status.Phase, reasonOf(pod))
			}
			devs := devicesOf(t, ctx, pod)
			for _, c := range tc.checks {
				c(t, pod, devs)
			}
			checkContainersSeeDevices(t, pod, devs)
			for _, d := range devs {
				key := pod.Spec.NodeName + "/" + d.Name
				if other, dup := seen[key]; dup {
					t.Errorf("device %s given to both %s and %s/%s", key, other, tc.ns, tc.pod)
				}
				seen[key] = tc.ns + "/" + tc.pod
			}
		})
	}

	t.Run("extended-resources/classic-gpu", func(t *testing.T) {
		pods, err := demo.Client().CoreV1().Pods("extended-resources").List(ctx, metav1.ListOptions{LabelSelector: "app=classic-gpu"})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 2 {
			t.Fatalf("%d pods of the Deployment, want 2", len(pods.Items))
		}
		for i := range pods.Items {
			pod := &pods.Items[i]
			if pod.Status.Phase != corev1.PodRunning {
				t.Fatalf("%s: phase %s; reason: %s", pod.Name, pod.Status.Phase, reasonOf(pod))
			}
			if pod.Spec.NodeName == "a100-classic" {
				// The demo's device-plugin node: the kubelet's device
				// manager gave the container one of gpudra's device-plugin
				// devices, and no claim was made.
				ctrs, _ := demo.SimNode(pod.Spec.NodeName).Containers(pod)
				if cdi := ctrs["ctr"].CDIDevices; len(cdi) != 1 || !strings.HasPrefix(cdi[0], "k8s.gpu.nvidia.com/device=gpu-") || pod.Status.ExtendedResourceClaimStatus != nil {
					t.Errorf("%s on the device-plugin node: CDI devices %v, extended claim %+v", pod.Name, cdi, pod.Status.ExtendedResourceClaimStatus)
				}
				continue
			}
			devs := devicesOf(t, ctx, pod)
			isType("gpu", 1)(t, pod, devs)
			extendedClaim(t, pod, devs)
			checkContainersSeeDevices(t, pod, devs)
			for _, d := range devs {
				key := pod.Spec.NodeName + "/" + d.Name
				if other, dup := seen[key]; dup {
					t.Errorf("device %s given to both %s and %s", key, other, pod.Name)
				}
				seen[key] = pod.Name
			}
		}
	})

	t.Run("compute-domain", func(t *testing.T) {
		checkComputeDomainExample(t, ctx)
	})

	t.Run("job-claim-template", func(t *testing.T) {
		job, err := demo.Client().BatchV1().Jobs("job-claim-template").Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !jobComplete(job) || job.Status.Succeeded != 4 {
			t.Fatalf("job not complete: succeeded %d, conditions %+v", job.Status.Succeeded, job.Status.Conditions)
		}
		pods, err := demo.Client().CoreV1().Pods("job-claim-template").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 4 {
			t.Errorf("%d job pods, want 4", len(pods.Items))
		}
		for _, pod := range pods.Items {
			ctrs, ok := demo.SimNode(pod.Spec.NodeName).Containers(&pod)
			if pod.Status.Phase != corev1.PodSucceeded || !ok || len(withoutMetadata(ctrs["ctr"].CDIDevices)) != 1 {
				t.Errorf("job pod %s: phase %s, containers %+v", pod.Name, pod.Status.Phase, ctrs)
			}
		}
	})
}

// deleteNamespaces deletes the namespaces among objs and waits until they
// are gone, with their pods and claims, so that their devices are free.
func deleteNamespaces(t *testing.T, objs []manifests.Object) {
	t.Helper()
	var names []string
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			names = append(names, o.GetName())
		}
	}
	deleteNamespacesNamed(t, names...)
}

// deleteNamespacesNamed deletes the demo cluster's namespaces and waits
// until they are gone: a test's pods, even Pending ones, hold their claims'
// devices until then, and the tests after it need them.
func deleteNamespacesNamed(t *testing.T, names ...string) {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	for _, n := range names {
		if err := demo.Client().CoreV1().Namespaces().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", n, err)
		}
	}
	err := clustertest.Poll(ctx, 0, func() bool {
		for _, n := range names {
			if _, err := demo.Client().CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Errorf("namespaces %v not gone: %v", names, err)
	}
}

func jobComplete(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// checkComputeDomainExample checks examples/compute-domain: the domain
// becomes Ready with its 4 nodes, and each of the Job's 4 workers runs on
// a node of its own whose container sees exactly the domain's channel.
func checkComputeDomainExample(t *testing.T, ctx context.Context) {
	const ns, domain = "compute-domain", "nvl-4"
	var cd *v1beta1.ComputeDomain
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := demo.Dynamic().Resource(computedomain.GVR).Namespace(ns).Get(ctx, domain, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if cd, err = computedomain.FromUnstructured(u); err != nil {
			return false, err
		}
		return cd.Status.Status == v1beta1.ComputeDomainStatusReady && len(cd.Status.Nodes) == 4 && cd.Status.Channel != nil, nil
	})
	if err != nil {
		t.Fatalf("ComputeDomain %s/%s is not Ready with 4 nodes: %v; status %+v", ns, domain, err, statusOf(cd))
	}
	channel := fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", *cd.Status.Channel)
	pods, err := demo.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=nvl-4-worker"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 4 {
		t.Fatalf("%d workers, want 4", len(pods.Items))
	}
	nodes := map[string]string{}
	for _, pod := range pods.Items {
		if other, dup := nodes[pod.Spec.NodeName]; dup {
			t.Errorf("workers %s and %s both on %s", other, pod.Name, pod.Spec.NodeName)
		}
		nodes[pod.Spec.NodeName] = pod.Name
		ctrs, ok := demo.SimNode(pod.Spec.NodeName).Containers(&pod)
		var imexNodes []string
		for _, d := range ctrs["ctr"].DeviceNodes {
			if strings.HasPrefix(d, "/dev/nvidia-caps-imex-channels/") {
				imexNodes = append(imexNodes, d)
			}
		}
		if pod.Status.Phase != corev1.PodRunning || !ok || !slices.Equal(imexNodes, []string{channel}) {
			t.Errorf("worker %s on %s: phase %s, IMEX channels %v, want exactly %s", pod.Name, pod.Spec.NodeName, pod.Status.Phase, imexNodes, channel)
		}
	}
	for _, n := range cd.Status.Nodes {
		if _, ok := nodes[n.Name]; !ok || n.Status != v1beta1.ComputeDomainStatusReady {
			t.Errorf("domain node %+v: not Ready, or no worker on it (workers on %v)", *n, nodes)
		}
	}
}
