// Package workloadclaims runs claims of a whole workload (KEP-5729) in the
// local cluster: a ResourceClaim reserved for a PodGroup instead of its
// pods. The feature gates it needs (DRAWorkloadResourceClaims and
// GenericWorkload, both off by default in Kubernetes 1.37) are
// process-wide, so the test has a package, and a process, of its own.
package workloadclaims

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/simnode"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

func TestMain(m *testing.M) {
	// Started as nvidia-imex or nvidia-imex-ctl: the nodes' simulated
	// daemons (cluster.Start installs them).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	clustertest.ParseFlags("ERROR")
	os.Exit(m.Run())
}

// gates turn claims of a PodGroup on: KEP-5729's gate and the PodGroup
// API's.
var gates = map[string]bool{"DRAWorkloadResourceClaims": true, "GenericWorkload": true}

// fleet is two GB200 compute trays of one NVLink clique.
const fleet = clustertest.GB200Pair

// groupSize is the number of pods of the PodGroup.
const groupSize = 32

// domainAndGroup is a ComputeDomain and a PodGroup whose one claim, from
// the domain's channel template, all the group's pods share: the resource
// claim controller creates it for the PodGroup and the scheduler reserves
// it for the PodGroup, not for each pod.
const domainAndGroup = `
apiVersion: v1
kind: Namespace
metadata:
  name: trainers
---
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: trainers
  namespace: trainers
spec:
  numNodes: 1
  channel:
    resourceClaimTemplate:
      name: trainers-channel
---
apiVersion: scheduling.k8s.io/v1beta1
kind: PodGroup
metadata:
  name: trainers
  namespace: trainers
spec:
  schedulingPolicy:
    basic: {}
  resourceClaims:
  - name: channel
    resourceClaimTemplateName: trainers-channel
`

// member is pod i of the PodGroup: its claim matches the PodGroup's
// exactly (name and template), which is what makes it the group's.
const member = `
apiVersion: v1
kind: Pod
metadata:
  name: trainer-%d
  namespace: trainers
spec:
  schedulingGroup:
    podGroupName: trainers
  containers:
  - name: ctr
    image: ubuntu:24.04
    command: ["sleep", "infinity"]
    resources:
      claims:
      - name: channel
  resourceClaims:
  - name: channel
    resourceClaimTemplateName: trainers-channel
`

// TestComputeDomainChannelOfPodGroup: a ComputeDomain's channel claim
// shared by a PodGroup of 32 pods. The claim is reserved for the PodGroup
// (one entry, not 32 pods), every pod runs with the domain's channel, and
// the channel plugin's checkpoint records the PodGroup as the claim's
// consumer. One claim has one allocation, on one node (a node's channel
// device is its own), so the group's pods all run on that node of the
// clique.
func TestComputeDomainChannelOfPodGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	f, err := simfleet.Parse([]byte(fleet), "gb200-pair")
	if err != nil {
		t.Fatal(err)
	}
	opts := cluster.Options{Fleet: f, Dir: clustertest.ShortTempDir(t)}
	opts.ControlPlane.FeatureGates = gates
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})

	text := domainAndGroup
	for i := range groupSize {
		text += "---" + fmt.Sprintf(member, i)
	}
	objs, err := manifests.Parse([]byte(text), t.Name())
	if err != nil {
		t.Fatal(err)
	}
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

	client := c.Client()
	var pods []corev1.Pod
	err = clustertest.Poll(ctx, 0, func() bool {
		list, err := client.CoreV1().Pods("trainers").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		pods = list.Items
		return len(pods) == groupSize && !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Status.Phase != corev1.PodRunning })
	})
	if err != nil {
		var notRunning []string
		for _, p := range pods {
			if p.Status.Phase != corev1.PodRunning {
				notRunning = append(notRunning, p.Name+" "+string(p.Status.Phase))
			}
		}
		t.Fatalf("the group's pods never all ran: %d pods, not running: %v", len(pods), notRunning)
	}

	group, err := client.SchedulingV1beta1().PodGroups("trainers").Get(ctx, "trainers", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(group.Status.ResourceClaimStatuses) != 1 || group.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("PodGroup's claim statuses: %+v, want the claim made from the template", group.Status.ResourceClaimStatuses)
	}
	claimName := *group.Status.ResourceClaimStatuses[0].ResourceClaimName
	claim, err := client.ResourceV1().ResourceClaims("trainers").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reserved := claim.Status.ReservedFor
	if len(reserved) != 1 || reserved[0].APIGroup != "scheduling.k8s.io" || reserved[0].Resource != "podgroups" ||
		reserved[0].Name != "trainers" || reserved[0].UID != group.UID {
		t.Errorf("claim %s reservedFor %+v, want the PodGroup trainers (uid %s) alone", claimName, reserved, group.UID)
	}
	t.Logf("claim %s reserved for %d consumer(s), %s %s; %d pods use it", claimName, len(reserved), reserved[0].Resource, reserved[0].Name, len(pods))

	// Every pod uses the claim, and its container has the domain's
	// channel.
	cd, err := c.Dynamic().Resource(computedomain.GVR).Namespace("trainers").Get(ctx, "trainers", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	domain, err := computedomain.FromUnstructured(cd)
	if err != nil || domain.Status.Channel == nil {
		t.Fatalf("domain has no channel: %v", err)
	}
	channel := fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", *domain.Status.Channel)
	nodes := map[string]int{}
	for i := range pods {
		p := &pods[i]
		nodes[p.Spec.NodeName]++
		if names := cluster.ClaimNames(p); !slices.Equal(names, []string{claimName}) {
			t.Errorf("pod %s uses claims %v, want the group's %s", p.Name, names, claimName)
		}
		n := c.SimNode(p.Spec.NodeName)
		if n == nil {
			t.Fatalf("pod %s on %q, not a node of the fleet", p.Name, p.Spec.NodeName)
		}
		devs, ok := n.Containers(p)
		if !ok {
			t.Fatalf("node %s has no containers of pod %s", n.Name(), p.Name)
		}
		if got := devs["ctr"].DeviceNodes; !slices.ContainsFunc(got, func(d string) bool { return d == channel }) {
			t.Errorf("pod %s's container has device nodes %v, want %s", p.Name, got, channel)
		}
	}
	t.Logf("pods per node: %v", nodes)

	// The channel plugin of the node the claim is prepared on records the
	// PodGroup as its consumer.
	for node := range nodes {
		n := c.SimNode(node)
		dir := filepath.Join(filepath.Dir(n.PluginDataDir()), computedomain.DriverName)
		st, err := simnode.PeekCheckpoint(dir)
		if err != nil {
			t.Fatalf("node %s: channel plugin's checkpoint: %v", node, err)
		}
		rec := st.Claims[string(claim.UID)]
		if rec == nil {
			t.Fatalf("node %s: checkpoint in %s does not hold claim %s: %+v", node, dir, claim.UID, st.Claims)
		}
		want := []claimstate.Consumer{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: string(group.UID)}}
		if !slices.Equal(rec.Consumers, want) {
			t.Errorf("node %s: checkpoint's consumers of claim %s: %+v, want %+v", node, claim.UID, rec.Consumers, want)
		}
	}
}
