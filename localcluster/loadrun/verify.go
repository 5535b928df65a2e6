package loadrun

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"

	"github.com/gpudra/gpudra/localcluster/baseline"
	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// verifyLoad checks the outcome of a round: every pod Running on a node;
// with claims of driver, each pod's claim allocated exactly one device of
// its own node, of the pod's kind (loadKindLabel), no device (or share of
// one) given to two pods, and the node's DRA manager prepared that device
// for the container, whose CDI device resolved to a device node (gpudra)
// or to the baseline driver's environment variable. For gpudra it also
// checks the work behind a mixed pod: the MIG device of a MIG pod exists
// on its GPU (gpudra created it), and gpudra's checkpoint on the node
// holds a share pod's claim with the share's ID. Without claims (driver
// ""), no pod got a device.
func verifyLoad(ctx context.Context, c *cluster.Cluster, client kubernetes.Interface, prefix string, n int, driver string) error {
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claimList, err := client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	v := &loadVerifier{c: c, driver: driver, claims: map[string]*resourceapi.ResourceClaim{}, owner: map[string]string{},
		migs: map[string]map[string]bool{}, checkpoints: map[string]map[string]*claimstate.Claim{}}
	for i := range claimList.Items {
		v.claims[claimList.Items[i].Name] = &claimList.Items[i]
	}
	checked := 0
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !strings.HasPrefix(pod.Name, prefix+"-") {
			continue
		}
		checked++
		if err := v.pod(ctx, pod); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
		}
	}
	if checked != n {
		errs = append(errs, fmt.Errorf("%d %s pods, want %d", checked, prefix, n))
	}
	if len(errs) > 0 {
		return fmt.Errorf("load round %s: %d problems, the first: %w", prefix, len(errs), errs[0])
	}
	return nil
}

// loadVerifier checks the pods of one round. It reads each node's MIG
// devices and gpudra's checkpoint once, when a pod first needs them.
type loadVerifier struct {
	c      *cluster.Cluster
	driver string
	claims map[string]*resourceapi.ResourceClaim
	// owner is the pod of each pool/device[@shareID] given out.
	owner map[string]string
	// migs are the names of the MIG devices that exist, by node.
	migs map[string]map[string]bool
	// checkpoints are gpudra's checkpointed claims, by node and UID.
	checkpoints map[string]map[string]*claimstate.Claim
}

func (v *loadVerifier) pod(ctx context.Context, pod *corev1.Pod) error {
	if pod.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("phase %s", pod.Status.Phase)
	}
	node := v.c.SimNode(pod.Spec.NodeName)
	if node == nil {
		return fmt.Errorf("on unknown node %q", pod.Spec.NodeName)
	}
	ctrs, ok := node.Containers(pod)
	if !ok {
		return fmt.Errorf("node %s has no record of starting it", node.Name())
	}
	devs := ctrs["ctr"]
	if v.driver == "" {
		if len(devs.CDIDevices) != 0 || len(devs.Claims) != 0 {
			return fmt.Errorf("got devices %v without a claim", devs.CDIDevices)
		}
		return nil
	}
	names := cluster.ClaimNames(pod)
	if len(names) != 1 {
		return fmt.Errorf("claims %v, want one", names)
	}
	claim := v.claims[names[0]]
	if claim == nil || claim.Status.Allocation == nil {
		return fmt.Errorf("claim %s missing or not allocated", names[0])
	}
	results := claim.Status.Allocation.Devices.Results
	if len(results) != 1 {
		return fmt.Errorf("claim %s has %d devices, want 1", claim.Name, len(results))
	}
	res := results[0]
	if res.Driver != v.driver || res.Pool != node.Name() {
		return fmt.Errorf("claim %s: device %s/%s/%s, want one of node %s", claim.Name, res.Driver, res.Pool, res.Device, node.Name())
	}
	kind := podKind(pod.Labels[loadKindLabel])
	if err := checkKind(kind, res); err != nil {
		return fmt.Errorf("claim %s: %w", claim.Name, err)
	}
	key := res.Pool + "/" + res.Device
	if res.ShareID != nil {
		key += "@" + string(*res.ShareID)
	}
	if other, taken := v.owner[key]; taken {
		return fmt.Errorf("device %s also given to pod %s", key, other)
	}
	v.owner[key] = pod.Name
	if len(devs.Claims) != 1 || len(devs.Claims[0].Devices) != 1 {
		return fmt.Errorf("node prepared %+v, want one claim with one device", devs.Claims)
	}
	if p := devs.Claims[0].Devices[0]; p.Pool != res.Pool || p.Device != res.Device {
		return fmt.Errorf("node prepared %s/%s, claim allocated %s", p.Pool, p.Device, key)
	}
	if v.driver == v.c.Options().Baseline {
		if got := devs.Env[baseline.DeviceEnv]; len(devs.CDIDevices) == 0 || got != res.Device {
			return fmt.Errorf("CDI devices %v resolved to %s=%q, want %q", devs.CDIDevices, baseline.DeviceEnv, got, res.Device)
		}
		return nil
	}
	if len(devs.CDIDevices) == 0 || len(devs.DeviceNodes) == 0 {
		return fmt.Errorf("CDI devices %v resolved to device nodes %v", devs.CDIDevices, devs.DeviceNodes)
	}
	switch kind {
	case kindMIG:
		migs, err := v.migsOf(ctx, node)
		if err != nil {
			return err
		}
		if !migs[res.Device] {
			return fmt.Errorf("MIG device %s was not created on node %s", res.Device, node.Name())
		}
	case kindShare:
		claims, err := v.checkpointOf(node)
		if err != nil {
			return err
		}
		if !holds(claims[string(claim.UID)], res.Device, string(*res.ShareID)) {
			return fmt.Errorf("gpudra's checkpoint on node %s has no share %s of %s for claim %s", node.Name(), *res.ShareID, res.Device, claim.UID)
		}
	}
	return nil
}

// checkKind checks that an allocated device is what a pod of the kind
// asks for.
func checkKind(kind podKind, res resourceapi.DeviceRequestAllocationResult) error {
	switch kind {
	case kindMIG:
		if !loadMIGName.MatchString(res.Device) {
			return fmt.Errorf("device %s for a MIG pod, want a %s MIG device", res.Device, loadMIGProfile)
		}
	case kindShare:
		if mem, ok := res.ConsumedCapacity["memory"]; res.ShareID == nil || !ok || !mem.IsZero() {
			return fmt.Errorf("device %s for a share pod: share ID %v, consumed %v; want a share of memory 0", res.Device, res.ShareID, res.ConsumedCapacity)
		}
	case kindGPU:
		if strings.Contains(res.Device, "-mig-") {
			return fmt.Errorf("MIG device %s for a whole-GPU pod", res.Device)
		}
	default:
		return fmt.Errorf("pod kind %q (label %s) is not one of gpu, mig, share", kind, loadKindLabel)
	}
	return nil
}

// loadMIGName matches the names of loadMIGProfile's MIG devices
// (devicemodel.MIGName), not those of a profile whose name extends it
// (1g.10gb+me is 1g10gb-me).
var loadMIGName = regexp.MustCompile(`^gpu-[0-9]+-mig-` + devicemodel.NormalizeProfile(loadMIGProfile) + `-[0-9]+-[0-9]+$`)

// migsOf returns the names of the MIG devices that exist on node.
func (v *loadVerifier) migsOf(ctx context.Context, node *simnode.Node) (map[string]bool, error) {
	if m, ok := v.migs[node.Name()]; ok {
		return m, nil
	}
	inv, err := node.Hardware().Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover node %s: %w", node.Name(), err)
	}
	m := map[string]bool{}
	for _, g := range inv.GPUs {
		for _, d := range g.MIGDevices {
			m[devicemodel.MIGName(g.Minor, d.Profile, d.ProfileID, d.PlacementStart)] = true
		}
	}
	v.migs[node.Name()] = m
	return m, nil
}

// checkpointOf returns the claims of gpudra's checkpoint on node, by UID.
func (v *loadVerifier) checkpointOf(node *simnode.Node) (map[string]*claimstate.Claim, error) {
	if m, ok := v.checkpoints[node.Name()]; ok {
		return m, nil
	}
	st, err := node.Checkpoint()
	if err != nil {
		return nil, fmt.Errorf("gpudra's checkpoint on node %s: %w", node.Name(), err)
	}
	v.checkpoints[node.Name()] = st.Claims
	return st.Claims, nil
}

// holds reports whether the checkpointed claim holds the share shareID of
// device.
func holds(c *claimstate.Claim, device, shareID string) bool {
	if c == nil {
		return false
	}
	for _, d := range c.Devices {
		if d.Name == device && d.ShareID == shareID {
			return true
		}
	}
	return false
}
