package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/imexfake"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/imex"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// imexFleet is four GB200 compute trays of one NVLink clique.
const imexFleet = `
nodes:
- {name: nvl-0, fabric: {cliqueID: 1}, gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]}
- {name: nvl-1, fabric: {cliqueID: 1}, gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]}
- {name: nvl-2, fabric: {cliqueID: 1}, gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]}
- {name: nvl-3, fabric: {cliqueID: 1}, gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]}
`

// imexDomain is a ComputeDomain of four nodes.
const imexDomain = `
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: imex-4
  namespace: imex-demo
spec:
  numNodes: 4
  channel:
    resourceClaimTemplate:
      name: imex-4-channel
`

// imexPod is a pod of the domain pinned to a node (by affinity: a pod
// given its node skips the scheduler, which allocates its claim).
const imexPod = `
apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: imex-demo
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchFields:
          - key: metadata.name
            operator: In
            values: [%[2]s]
  containers:
  - name: ctr
    image: ubuntu:22.04
    command: ["bash", "-c", "ls /dev/nvidia-caps-imex-channels; sleep 9999"]
    resources:
      claims:
      - name: channel
  resourceClaims:
  - name: channel
    resourceClaimTemplateName: imex-4-channel
`

// TestComputeDomainIMEXDaemons: a numNodes 4 domain on four trays becomes
// Ready through the nodes' supervised (fake) IMEX daemons, with four
// distinct indices; every pod gets the channel; each node's hosts file
// maps its peers and its daemon resolved them; a SIGKILLed daemon is
// restarted and the domain is Ready again with the same indices; a
// restarted controller changes none of the domain's objects; a claim
// naming a missing domain fails naming it; deleting the domain leaves no
// clique, template or CDI spec, and no daemon survives.
func TestComputeDomainIMEXDaemons(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	bin, removeIMEX, err := cluster.FakeIMEX()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(removeIMEX)
	// Checked after the cluster's stop (cleanups run last first), before
	// removeIMEX kills what is left.
	t.Cleanup(func() {
		if left := imexfake.Daemons(dirOf(bin)); len(left) != 0 {
			t.Errorf("fake IMEX daemons survive the cluster: %v", left)
		}
	})
	// The chart's IMEX values, with an idle stop short enough that the
	// test sees daemons go soon after their last pod.
	values := map[string]any{"computeDomains": map[string]any{"kubeletPlugin": map[string]any{"imex": map[string]any{"idleStop": "2s"}}}}
	c := startFleet(t, ctx, "imex-fleet", imexFleet, cluster.Options{IMEXBinary: bin, ChartValues: values})
	apply := func(yamlText string) {
		t.Helper()
		applyIn(t, ctx, c, yamlText)
	}
	nodes := []string{"nvl-0", "nvl-1", "nvl-2", "nvl-3"}
	apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: imex-demo\n")
	start := time.Now()
	apply(imexDomain)
	for i, n := range nodes {
		apply(fmt.Sprintf(imexPod, fmt.Sprintf("worker-%d", i), n))
	}

	dyn := c.Dynamic()
	getDomain := func() (*v1beta1.ComputeDomain, error) {
		obj, err := dyn.Resource(computedomain.GVR).Namespace("imex-demo").Get(ctx, "imex-4", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return computedomain.FromUnstructured(obj)
	}
	// waitReady waits for the domain to be Ready with four nodes of
	// distinct indices, and returns each node's index.
	waitReady := func(step string) map[string]int {
		t.Helper()
		var last *v1beta1.ComputeDomain
		err := clustertest.Poll(ctx, 90*time.Second, func() bool {
			cd, err := getDomain()
			if err != nil {
				return false
			}
			last = cd
			return cd.Status.Status == v1beta1.ComputeDomainStatusReady && len(cd.Status.Nodes) == 4
		})
		if err != nil {
			t.Fatalf("%s: the domain is not Ready with 4 nodes: %v; status %+v", step, err, statusOf(last))
		}
		idx := map[string]int{}
		seen := map[int]bool{}
		for _, n := range last.Status.Nodes {
			if seen[n.Index] || n.Status != v1beta1.ComputeDomainStatusReady {
				t.Fatalf("%s: nodes %+v: want 4 Ready nodes with distinct indices", step, statusOf(last))
			}
			seen[n.Index] = true
			idx[n.Name] = n.Index
		}
		return idx
	}
	indices := waitReady("start")
	t.Logf("domain Ready %v after creation", time.Since(start).Round(time.Millisecond))

	channel := func() string {
		cd, err := getDomain()
		if err != nil || cd.Status.Channel == nil {
			t.Fatalf("domain channel: %v", err)
		}
		return fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", *cd.Status.Channel)
	}()
	for i, n := range nodes {
		pod := waitForPodIn(t, ctx, c, "imex-demo", fmt.Sprintf("worker-%d", i), "Running", running)
		devs, ok := c.SimNode(n).Containers(pod)
		if !ok || !slices.Contains(devs["ctr"].DeviceNodes, channel) {
			t.Errorf("pod worker-%d on %s: device nodes %v, want %s", i, n, devs["ctr"].DeviceNodes, channel)
		}
	}

	// Each node's hosts file maps every peer's name to its IP, and its
	// daemon resolved them (SIGUSR1) without a restart.
	ips := map[string]string{}
	cd, _ := getDomain()
	for _, n := range cd.Status.Nodes {
		ips[imex.PeerName(n.Index)] = n.IPAddress
	}
	for _, n := range nodes {
		node := c.SimNode(n)
		var peers map[string]string
		var rec imexfake.Record
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			peers, _ = imex.HostsFile{Path: node.IMEXHostsFile()}.Peers()
			rec, _ = imexfake.ReadRecord(node.IMEXDir())
			return maps.Equal(peers, ips) && maps.Equal(rec.Peers, ips), nil
		})
		if err != nil {
			t.Errorf("%s: hosts block %v, daemon resolved %v; want %v", n, peers, rec.Peers, ips)
		}
		if st := node.IMEX().Supervisor().Status(); st.Starts != 1 {
			t.Errorf("%s: the daemon was started %d times, want once (a peer joining must not restart it)", n, st.Starts)
		}
	}

	// A SIGKILLed daemon is restarted; the domain is Ready again with the
	// same indices.
	victim := c.SimNode("nvl-1").IMEX().Supervisor()
	old := victim.Status().PID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = clustertest.Poll(ctx, 60*time.Second, func() bool {
		st := victim.Status()
		return st.PID != 0 && st.PID != old && st.Ready
	})
	if err != nil {
		t.Fatalf("nvl-1's daemon was not restarted after SIGKILL: %+v", victim.Status())
	}
	if again := waitReady("after SIGKILL"); !maps.Equal(again, indices) {
		t.Errorf("indices changed across the restart: %v, then %v", indices, again)
	}

	// Restarting the controller (a new pod takes over its Lease) changes
	// nothing: the domain, its template and its cliques keep their
	// resourceVersions.
	versions := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		obj, err := dyn.Resource(computedomain.GVR).Namespace("imex-demo").Get(ctx, "imex-4", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out["ComputeDomain "+obj.GetName()] = obj.GetResourceVersion()
		templates, err := c.Client().ResourceV1().ResourceClaimTemplates("imex-demo").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tmpl := range templates.Items {
			out["ResourceClaimTemplate "+tmpl.Name] = tmpl.ResourceVersion
		}
		cliques, err := dyn.Resource(computedomain.CliqueGVR).Namespace(c.Release().Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cl := range cliques.Items {
			out["ComputeDomainClique "+cl.GetName()] = cl.GetResourceVersion()
		}
		return out
	}
	before := versions()
	if len(before) < 3 {
		t.Fatalf("objects of the domain before the restart: %v, want the domain, its template and a clique", before)
	}
	if err := c.RestartComputeDomainController(ctx); err != nil {
		t.Fatal(err)
	}
	// The new leader reconciles every domain at start; give it the time
	// of a few passes before looking.
	time.Sleep(3 * time.Second)
	if after := versions(); !maps.Equal(after, before) {
		t.Errorf("the controller's restart changed the domain's objects: resourceVersions %v, then %v", before, after)
	}

	// A claim naming a domain that does not exist fails, naming it.
	const missing = "00000000-0000-4000-8000-00000000beef"
	apply(fmt.Sprintf(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: stray
  namespace: imex-demo
spec:
  devices:
    requests:
    - name: channel
      exactly:
        deviceClassName: compute-domain-default-channel.nvidia.com
    config:
    - opaque:
        driver: compute-domain.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: ComputeDomainChannelConfig
          domainID: %s
---
apiVersion: v1
kind: Pod
metadata:
  name: stray
  namespace: imex-demo
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchFields:
          - key: metadata.name
            operator: In
            values: [nvl-2]
  containers:
  - name: ctr
    image: ubuntu:22.04
    resources:
      claims:
      - name: channel
  resourceClaims:
  - name: channel
    resourceClaimName: stray
`, missing))
	var reason string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client().CoreV1().Pods("imex-demo").Get(ctx, "stray", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		reason = reasonOf(p)
		return strings.Contains(reason, missing), nil
	})
	if err != nil {
		t.Errorf("the pod of a claim naming a missing domain: reason %q, want one naming %s", reason, missing)
	}

	// Deleting the pods and the domain leaves no clique, template, CDI
	// spec or daemon.
	for _, name := range []string{"stray", "worker-0", "worker-1", "worker-2", "worker-3"} {
		if err := c.Client().CoreV1().Pods("imex-demo").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	if err := dyn.Resource(computedomain.GVR).Namespace("imex-demo").Delete(ctx, "imex-4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var left []string
	err = clustertest.Poll(ctx, 90*time.Second, func() bool {
		left = left[:0]
		if _, err := getDomain(); !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("domain (%v)", err))
		}
		cliques, err := dyn.Resource(computedomain.CliqueGVR).Namespace(c.Release().Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			left = append(left, fmt.Sprintf("cliques (%v)", err))
		} else {
			for _, cl := range cliques.Items {
				left = append(left, "clique "+cl.GetName())
			}
		}
		for _, n := range nodes {
			entries, _ := os.ReadDir(c.SimNode(n).CDIDir())
			for _, e := range entries {
				if strings.Contains(e.Name(), "compute-domain") && strings.HasSuffix(e.Name(), ".json") {
					left = append(left, n+" CDI spec "+e.Name())
				}
			}
			if pid := c.SimNode(n).IMEX().Supervisor().Status().PID; pid != 0 {
				left = append(left, fmt.Sprintf("%s daemon pid %d", n, pid))
			}
		}
		for _, d := range imexfake.Daemons(dirOf(bin)) {
			left = append(left, fmt.Sprintf("fake daemon pid %d", d.PID))
		}
		return len(left) == 0
	})
	if err != nil {
		t.Errorf("left after the domain's deletion: %v", left)
	}
	if _, err := c.Client().ResourceV1().ResourceClaimTemplates("imex-demo").Get(ctx, "imex-4-channel", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the domain's template stayed: %v", err)
	}
}

func statusOf(cd *v1beta1.ComputeDomain) any {
	if cd == nil {
		return nil
	}
	var nodes []v1beta1.ComputeDomainNode
	for _, n := range cd.Status.Nodes {
		nodes = append(nodes, *n)
	}
	return struct {
		Status     v1beta1.ComputeDomainStatusValue
		Nodes      []v1beta1.ComputeDomainNode
		Conditions []metav1.Condition
	}{cd.Status.Status, nodes, cd.Status.Conditions}
}

func dirOf(path string) string { return filepath.Dir(path) }
