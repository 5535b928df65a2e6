package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Stale allocations: the API server has a claim allocated to devices a
// running claim holds whole, as a scheduler acting on a stale view leaves it, or
// a claim force-deleted and re-created under its name while the node
// still has the old one prepared. The new claim is allocated, reserved
// for a pod of this node and prepared by the kubelet like any other; the
// plugin must refuse it while the running claim holds the devices, also
// after a lost checkpoint, when adoption finds both claims allocated here.
const (
	kindStale    kind = "stale"     // a copy of a running claim's allocation
	kindStaleMIG kind = "stale-mig" // the same, of a claim with a dynamic MIG device
)

// staleClaim allocates a new claim to the devices of a running claim
// (one with a MIG device half of the time, when there is one) and returns
// it, nil when no claim runs.
func (t *trial) staleClaim(ctx context.Context) (*claim, error) {
	var running, withMIG []*claim
	for _, uid := range slices.Sorted(maps.Keys(t.live)) {
		c := t.live[uid]
		if c.phase != phasePrepared || c.forced || shared(c) {
			continue
		}
		running = append(running, c)
		if hasMIG(c.kind) {
			withMIG = append(withMIG, c)
		}
	}
	if len(withMIG) > 0 && t.rng.IntN(2) == 0 {
		running = withMIG
	}
	if len(running) == 0 {
		return nil, nil
	}
	holder := running[t.rng.IntN(len(running))]
	k := kindStale
	if hasMIG(holder.kind) {
		k = kindStaleMIG
	}
	t.seq++
	name := fmt.Sprintf("c%d-%s", t.seq, k)
	claims := t.n.client.ResourceV1().ResourceClaims(namespace)
	obj, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       *holder.obj.Spec.DeepCopy(),
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	pod, err := t.n.client.CoreV1().Pods(namespace).Create(ctx, podFor(name), metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	alloc := holder.obj.Status.Allocation.DeepCopy()
	obj.Status.Allocation = alloc
	obj.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if obj, err = claims.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("write the allocation of %s: %w", name, err)
	}
	// The scheduler counts the stale allocation too: the devices stay
	// taken until both claims are released.
	t.sched.live[obj.UID] = alloc
	t.sum.Claims[k]++
	t.sum.StaleClaims++
	t.claims++
	t.trace("%s: allocated %v, the devices of running claim %s", name, allocated(alloc), holder.obj.Name)
	c := &claim{obj: obj, kind: k}
	t.live[obj.UID] = c
	return c, nil
}

// shared reports whether the claim holds a share of a device: another
// claim may hold a share of it too (a new allocation would get share IDs
// of its own), so only devices held whole make stale allocations.
func shared(c *claim) bool {
	return slices.ContainsFunc(c.obj.Status.Allocation.Devices.Results, func(r resourceapi.DeviceRequestAllocationResult) bool {
		return r.ShareID != nil
	})
}

// hasMIG reports whether claims of the kind hold a dynamic MIG device.
func hasMIG(k kind) bool {
	return k == kindMIG || k == kindMIGMPS || k == kindGPUAndMIG || k == kindStaleMIG
}
