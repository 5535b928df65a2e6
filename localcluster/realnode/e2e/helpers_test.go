// Package e2e holds the end-to-end tests of a real node in the local
// cluster: the real kubelet, containerd and runc, gpudra installed from
// its chart as a container of its image, and busybox containers whose
// output says what they saw. They run with GPUDRA_REAL_NODE=1 (make
// test-real-node) and skip otherwise.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/node"
	"github.com/gpudra/gpudra/localcluster/realnode/probe"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// realNode skips the test unless GPUDRA_REAL_NODE=1; asked for on a
// machine that cannot run a real node, it fails saying what the machine
// lacks (CI runs these tests and must not pass by skipping them).
func realNode(t *testing.T) {
	t.Helper()
	if os.Getenv("GPUDRA_REAL_NODE") != "1" {
		t.Skip("real node tests need GPUDRA_REAL_NODE=1 (make test-real-node): they build the kubelet and containerd and run containers as root")
	}
	if err := containerruntime.CheckMachine(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

var (
	binariesOnce sync.Once
	binaries     node.Binaries
	binariesErr  error
)

// startCluster starts a local cluster of the named built-in fleet whose
// first node is real.
func startCluster(t *testing.T, fleetName string) (*cluster.Cluster, context.Context) {
	t.Helper()
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	t.Cleanup(cancel)
	binariesOnce.Do(func() { binaries, binariesErr = node.BuildBinaries(ctx) })
	if binariesErr != nil {
		t.Fatal(binariesErr)
	}
	fleet, err := simfleet.Load(fleetName)
	if err != nil {
		t.Fatal(err)
	}
	// Short: unix sockets lie below it.
	dir, err := os.MkdirTemp("", "gpudra-rn-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Fleet: fleet,
		Dir:   dir,
		RealNodes: &cluster.RealNodes{
			Count:     1,
			FleetName: fleetName,
			Binaries:  binaries,
		},
		Progress: func(msg string) { t.Log(msg) },
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("kept %s", dir)
		}
	})
	return c, ctx
}

// probePod returns a pod on the real node whose busybox container prints
// what it sees and then sleeps, with a claim from the template.
func probePod(ns, name, nodeName, template string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: nodeName},
			Tolerations:                   []corev1.Toleration{node.Toleration},
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name:            "ctr",
				Image:           containerruntime.TestImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         probe.Command(3600),
				Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: ptr.To(template)}},
		},
	}
}

// runProbe creates the template (if new) and the pod, waits until the
// container has printed what it sees, and returns the pod, its claim and
// what the container saw.
func runProbe(t *testing.T, ctx context.Context, c *cluster.Cluster, tmpl *resourceapi.ResourceClaimTemplate, podName string) (*corev1.Pod, *resourceapi.ResourceClaim, *probe.Seen) {
	t.Helper()
	client := c.Client()
	if _, err := client.ResourceV1().ResourceClaimTemplates(tmpl.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rn := c.RealNodes()[0]
	pod, err := client.CoreV1().Pods(tmpl.Namespace).Create(ctx, probePod(tmpl.Namespace, podName, rn.Name(), tmpl.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var seen *probe.Seen
	var last string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		last = fmt.Sprintf("%s %s", p.Status.Phase, cluster.PodReason(p))
		if p.Status.Phase != corev1.PodRunning {
			return p.Status.Phase == corev1.PodFailed, nil
		}
		out, err := rn.ContainerLog(p, "ctr")
		if err != nil {
			return false, nil
		}
		s, complete := probe.Parse(out)
		seen = s
		return complete, nil
	})
	if err != nil || seen == nil {
		t.Fatalf("pod %s: %v (last: %s; kubelet log %s)", podName, err, last, rn.KubeletLog())
	}
	claim := podClaim(t, ctx, c, pod)
	return pod, claim, seen
}

// podClaim returns the pod's one claim.
func podClaim(t *testing.T, ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s: claim statuses %v", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	claim, err := c.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *pod.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %v", claim.Name, claim.Status.Allocation)
	}
	return claim
}

// controlNodes are the driver's nodes every GPU claim gets.
var controlNodes = []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}

// gpuNodes returns the /dev/nvidia<N> nodes in seen.
func gpuNodes(seen *probe.Seen) []string {
	var out []string
	for _, d := range seen.DeviceNodes {
		rest, ok := strings.CutPrefix(d, "/dev/nvidia")
		if ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			out = append(out, d)
		}
	}
	return out
}

// specFiles returns the claim's CDI spec files in the node's CDI directory.
func specFiles(t *testing.T, n cluster.Node, claim *resourceapi.ResourceClaim) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(n.CDIDir(), "*"+string(claim.UID)+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checkpointHas reports whether the plugin's checkpoint holds the claim.
func checkpointHas(t *testing.T, n cluster.Node, claim *resourceapi.ResourceClaim) bool {
	t.Helper()
	st, err := n.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	return st.Claims[string(claim.UID)] != nil
}

// eventually calls try every half second until it succeeds, for up to
// 20 s, logging each failure; the test fails with the last one.
func eventually(t *testing.T, ctx context.Context, what string, try func() error) {
	t.Helper()
	var last error
	for attempt := 1; ; attempt++ {
		if last = try(); last == nil {
			return
		}
		t.Logf("%s, attempt %d: %v", what, attempt, last)
		if attempt == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("%s: %v", what, last)
}

// deletePod deletes the pod and waits until it is gone.
func deletePod(t *testing.T, ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) {
	t.Helper()
	if err := c.Client().CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, ctx, 2*time.Minute, "pod "+pod.Name+" gone", func() bool {
		_, err := c.Client().CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// checkMetadata finds, among the device metadata files the container saw,
// the one of the claim's request (a template claim's: under
// resourceclaimtemplates/<pod claim name>/<request>/), decodes it as a
// workload would, with the helper's decoder, and returns the attributes
// of the allocated device, which it checks are there.
func checkMetadata(t *testing.T, c *cluster.Cluster, seen *probe.Seen, claim *resourceapi.ResourceClaim) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	result := claim.Status.Allocation.Devices.Results[0]
	driver := c.Options().DriverName
	path := metadata.ContainerDir + "/" + metadata.ResourceClaimTemplatesSubDir + "/dev/" + result.Request + "/" + driver + metadata.MetadataFileSuffix
	text, ok := seen.Metadata[path]
	if !ok {
		t.Fatalf("the container has no device metadata file %s; it has %v", path, slices.Sorted(maps.Keys(seen.Metadata)))
	}
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(strings.NewReader(text)), &dm); err != nil {
		t.Fatalf("decode %s (%s): %v", path, text, err)
	}
	for _, r := range dm.Requests {
		for _, d := range r.Devices {
			if d.Driver == driver && d.Pool == result.Pool && d.Name == result.Device {
				if len(d.Attributes) == 0 {
					t.Fatalf("metadata of %s has no attributes: %s", d.Name, text)
				}
				return d.Attributes
			}
		}
	}
	t.Fatalf("metadata %s names no device %s/%s: %s", path, result.Pool, result.Device, text)
	return nil
}
