package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxLive bounds the claims on the node at once.
const maxLive = 10

// trial is one seed's run: a fresh node, rounds of kubelet calls with
// kills in between, and a drain at the end.
type trial struct {
	seed       uint64
	rng        *rand.Rand
	o          *Options
	n          *node
	sched      *scheduler
	sum        *Summary
	live       liveClaims
	seq        int
	profiles   []string // MIG profiles published
	initial    []string // devices published at the first start
	pool       pool     // the pool published at the first start
	violations []string
	claims     int
	kills      int
	snapshots  int
	inOutage   bool
	rollouts   int // rolling updates: the plugin's pod is the rollouts-th
}

func newTrial(seed uint64, o *Options, dir, mpsControl string, sum *Summary) *trial {
	rng := rand.New(rand.NewPCG(seed, 0x6770756472614348))
	p := profileExclusive
	if rng.IntN(2) == 1 {
		p = profileShared
	}
	return &trial{
		seed: seed, rng: rng, o: o, sum: sum, live: liveClaims{},
		n: &node{dir: dir, binary: o.Binary, mpsControl: mpsControl, profile: p, callTimeout: o.CallTimeout},
	}
}

// trace writes a line about the trial's progress when tracing.
func (t *trial) trace(format string, args ...any) {
	if t.o.Trace && t.o.Out != nil {
		fmt.Fprintf(t.o.Out, "chaos: seed %d: %s %s\n", t.seed, time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
}

func (t *trial) violate(format string, args ...any) {
	t.violations = append(t.violations, fmt.Sprintf(format, args...))
}

// listSlices implements kubeClient for the scheduler.
func (t *trial) listSlices(ctx context.Context) ([]*resourceapi.ResourceSlice, error) {
	return t.n.listSlices(ctx)
}

func (t *trial) run(ctx context.Context, outage bool) (err error) {
	n, err := newNode(ctx, t.o.API, t.n.dir, t.n.binary, t.n.mpsControl, t.n.profile, t.n.callTimeout)
	if err != nil {
		return err
	}
	t.n = n
	n.podUID = t.podUID(0)
	defer func() {
		n.stop()
		if err == nil && n.closeErr != nil {
			err = fmt.Errorf("leave the API server clean for the next trial: %w", n.closeErr)
		}
	}()
	if t.sched, err = newScheduler(t); err != nil {
		return err
	}
	if err := n.start(ctx); err != nil {
		return err
	}
	if t.initial, err = t.waitForPool(ctx, nil, time.Minute); err != nil {
		return err
	}
	published, err := n.listSlices(ctx)
	if err != nil {
		return err
	}
	t.pool = index(published)
	t.profiles = migProfiles(published)
	if len(t.profiles) == 0 {
		return errors.New("the node publishes no MIG devices")
	}
	outageAt := -1
	if outage {
		outageAt = t.rng.IntN(t.o.Steps)
	}
	for step := range t.o.Steps {
		if step == outageAt {
			if err := t.outage(ctx); err != nil {
				return err
			}
		}
		if err := t.step(ctx); err != nil {
			return err
		}
	}
	return t.drain(ctx)
}

// waitForPool waits until the API server has the node's complete pool:
// the devices of want, or any devices when want is nil. It returns them.
func (t *trial) waitForPool(ctx context.Context, want []string, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		list, err := t.n.listSlices(ctx)
		if err == nil && complete(list) {
			got := deviceNames(index(list).devices)
			if len(got) > 0 && (want == nil || slices.Equal(got, want)) {
				return got, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the node's pool is not published as expected after %v", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// complete reports whether the slices of the newest generation are all
// there.
func complete(list []*resourceapi.ResourceSlice) bool {
	var gen, count, want int64
	for _, s := range list {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	for _, s := range list {
		if s.Spec.Pool.Generation == gen {
			count++
			want = s.Spec.Pool.ResourceSliceCount
		}
	}
	return count > 0 && count == want
}

// newClaim makes a claim of a random kind, as a user and the scheduler
// would: the claim and its pod in the API server, allocated and reserved
// for the pod. nil when it does not fit.
func (t *trial) newClaim(ctx context.Context) (*claim, error) {
	kinds := kindsOf(t.n.profile)
	k := kinds[t.rng.IntN(len(kinds))]
	t.seq++
	// A kind's "+" is no character of an object name (RFC 1123).
	name := fmt.Sprintf("c%d-%s", t.seq, strings.ReplaceAll(string(k), "+", "-"))
	claims := t.n.client.ResourceV1().ResourceClaims(namespace)
	obj, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       claimSpec(k, t.rng, t.profiles),
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	alloc, err := t.sched.allocate(ctx, obj)
	if err != nil {
		return nil, fmt.Errorf("allocate %s: %w", name, err)
	}
	if alloc == nil {
		t.trace("%s: no fit", name)
		t.sum.NoFit++
		return nil, claims.Delete(ctx, name, metav1.DeleteOptions{})
	}
	pod, err := t.n.client.CoreV1().Pods(namespace).Create(ctx, podFor(name), metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	obj.Status.Allocation = alloc
	obj.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if obj, err = claims.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("write the allocation of %s: %w", name, err)
	}
	t.sum.Claims[k]++
	t.claims++
	t.trace("%s: allocated %v", name, allocated(alloc))
	c := &claim{obj: obj, kind: k}
	t.live[obj.UID] = c
	return c, nil
}

// forget removes a claim the plugin unprepared: its objects leave the
// API server and its devices the scheduler.
func (t *trial) forget(ctx context.Context, c *claim) error {
	delete(t.live, c.obj.UID)
	t.sched.release(c.obj.UID)
	if c.forced {
		return nil
	}
	return t.deleteObjects(ctx, c)
}

func (t *trial) deleteObjects(ctx context.Context, c *claim) error {
	if err := t.n.client.ResourceV1().ResourceClaims(namespace).Delete(ctx, c.obj.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	pod := c.obj.Status.ReservedFor[0].Name
	if err := t.n.client.CoreV1().Pods(namespace).Delete(ctx, pod, forceDelete); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// forceDelete removes a pod at once: a pod bound to a node otherwise
// waits for its kubelet, which the harness plays only over DRA gRPC.
var forceDelete = metav1.DeleteOptions{GracePeriodSeconds: new(int64)}

// podFor is the pod of claim name, as the scheduler leaves it: bound to
// the node and referring to the claim. A real API server refuses a pod
// without a container; kube-scheduler leaves a bound pod alone.
func podFor(claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "pod-" + claim},
		Spec: corev1.PodSpec{
			NodeName:       nodeName,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
}

// call is one DRA call of a round.
type call struct {
	prepare bool
	claims  []*claim
	result  map[types.UID]outcome
	// to is the instance the call goes to (nil: the node's plugin); sent
	// when it went out, done when its answer came; raced: one of a pair
	// of calls for one claim through two instances at once, which collect
	// leaves to settleRaces.
	to         *proc
	sent, done time.Time
	raced      bool
}

// plan decides a round's calls: new claims to prepare, Prepare retries,
// re-prepares of prepared claims (a kubelet restart), unprepares (the pod
// ended, or the kubelet gave up on a claim that keeps failing), and now
// and then a forced deletion of a prepared claim and its pod.
func (t *trial) plan(ctx context.Context) ([]*call, error) {
	t.sched.refresh()
	var prep, unprep []*claim
	for range t.rng.IntN(5) {
		if len(t.live) >= maxLive {
			break
		}
		c, err := t.newClaim(ctx)
		if err != nil {
			return nil, err
		}
		if c != nil {
			prep = append(prep, c)
		}
	}
	if len(t.live) < maxLive && t.rng.Float64() < t.o.StaleProbability {
		c, err := t.staleClaim(ctx)
		if err != nil {
			return nil, err
		}
		if c != nil {
			prep = append(prep, c)
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(t.live)) {
		c := t.live[uid]
		if slices.Contains(prep, c) {
			continue
		}
		switch c.phase {
		case phaseAllocated:
			if c.failures >= 3 && t.rng.IntN(2) == 0 {
				t.trace("%s: the kubelet gives up on it", c.obj.Name)
				t.sum.GivenUp++
				c.phase = phaseReleasing
				unprep = append(unprep, c)
			} else {
				prep = append(prep, c)
			}
		case phasePrepared:
			switch r := t.rng.Float64(); {
			case r < 0.3:
				t.trace("%s: its pod ends", c.obj.Name)
				c.phase = phaseReleasing
				unprep = append(unprep, c)
			case r < 0.45 && !c.forced:
				prep = append(prep, c)
			case r < 0.5 && !c.forced:
				// The pod and claim are force-deleted: the scheduler hands
				// the devices out again at once, while the node still has
				// them prepared until the kubelet unprepares the claim or
				// the sweep finds it gone.
				c.forced = true
				t.sum.ForcedDeletions++
				t.trace("%s: force-deleted with its pod; its devices may go to other claims", c.obj.Name)
				t.sched.release(c.obj.UID)
				if err := t.deleteObjects(ctx, c); err != nil {
					return nil, err
				}
			}
		case phaseReleasing:
			unprep = append(unprep, c)
		}
	}
	return append(t.calls(prep, true), t.calls(unprep, false)...), nil
}

// calls groups claims into calls of one to three claims, as the kubelet
// sends a pod's claims together.
func (t *trial) calls(group []*claim, prepare bool) []*call {
	t.rng.Shuffle(len(group), func(i, j int) { group[i], group[j] = group[j], group[i] })
	var calls []*call
	for len(group) > 0 {
		k := min(len(group), 1+t.rng.IntN(3))
		calls = append(calls, &call{prepare: prepare, claims: group[:k]})
		group = group[k:]
	}
	return calls
}

// step runs one round: its calls at once, maybe a kill midway, then the
// checks.
func (t *trial) step(ctx context.Context) error {
	if !t.n.running() {
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
		if err := t.restart(ctx); err != nil {
			return err
		}
	}
	if t.rng.Float64() < t.o.RollingProbability {
		return t.rollingStep(ctx)
	}
	calls, err := t.plan(ctx)
	if err != nil {
		return err
	}
	wait := t.issue(ctx, calls)
	kill := t.rng.Float64() < t.o.KillProbability
	// Most kills come early, while the calls are in flight (a Prepare
	// takes milliseconds; one that starts an MPS daemon, tens).
	u := t.rng.Float64()
	delay := time.Duration(u * u * u * float64(t.o.MaxKillDelay))
	if kill {
		time.Sleep(delay)
		t.trace("SIGKILL %v after the calls", delay.Round(time.Millisecond))
		t.kills++
		t.sum.Kills++
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
	}
	wait()
	refused := t.collect(ctx, calls)
	if kill || !t.n.running() {
		if !kill {
			if err := t.n.kill(); err != nil {
				t.violate("crash: %v", err)
			}
		}
		t.checkNode(ctx, "after a kill", false)
		return t.restart(ctx)
	}
	return t.checkRefused(ctx, refused)
}

// issue starts the calls to the plugin process that runs now; the
// function it returns waits for them.
func (t *trial) issue(ctx context.Context, calls []*call) (wait func()) {
	var wg sync.WaitGroup
	dra, timeout := t.n.dra, t.n.callTimeout
	for _, c := range calls {
		t.sum.Calls++
		dra := dra
		if c.to != nil {
			dra = c.to.dra
		}
		wg.Go(func() {
			c.sent = time.Now()
			if c.prepare {
				c.result = prepare(ctx, dra, timeout, c.claims)
			} else {
				c.result = unprepare(ctx, dra, timeout, c.claims)
			}
			c.done = time.Now()
		})
	}
	return wg.Wait
}

// roundTrip makes the calls and takes in their outcomes.
func (t *trial) roundTrip(ctx context.Context, calls []*call) []*claim {
	t.issue(ctx, calls)()
	return t.collect(ctx, calls)
}

// collect takes in the outcomes of finished calls. It returns the claims
// whose Prepare the plugin refused.
func (t *trial) collect(ctx context.Context, calls []*call) []*claim {
	var refused []*claim
	for _, cl := range calls {
		if cl.raced {
			continue
		}
		transport := false
		for _, c := range cl.claims {
			o := cl.result[c.obj.UID]
			t.trace("%s %s: %s", map[bool]string{true: "prepare", false: "unprepare"}[cl.prepare], c.obj.Name, o)
			switch {
			case o.transport != nil:
				transport = true
			case o.err != "":
				t.sum.ClaimErrors++
				t.sum.ErrorMessages[normalize(o.err)]++
				if cl.prepare && c.phase == phasePrepared && !t.inOutage {
					t.violate("idempotent: claim %s (%s): Prepare of a prepared claim failed: %s", c.obj.Name, c.kind, o.err)
				}
				if cl.prepare && c.phase == phaseAllocated {
					c.failures++
					refused = append(refused, c)
				}
			case cl.prepare:
				for _, v := range resultMatches(c, o) {
					t.violate("%s", v)
				}
				if c.phase == phasePrepared && !slices.Equal(c.cdiIDs, o.cdiIDs) {
					t.violate("idempotent: claim %s (%s): Prepare returned %v, earlier %v", c.obj.Name, c.kind, o.cdiIDs, c.cdiIDs)
				}
				if c.phase == phaseAllocated {
					c.phase, c.cdiIDs, c.failures = phasePrepared, o.cdiIDs, 0
					t.sum.Prepared[c.kind]++
				}
			default:
				if err := t.forget(ctx, c); err != nil {
					t.violate("harness: %v", err)
				}
			}
		}
		if transport {
			t.sum.TransportErrors++
		}
	}
	return refused
}

// checkRefused checks that a refused Prepare left nothing behind: no
// checkpoint entry, no CDI spec (what it may have set up on the
// hardware is checked, as all hardware state is, after the next kill
// and at the end).
func (t *trial) checkRefused(ctx context.Context, refused []*claim) error {
	if len(refused) == 0 {
		return nil
	}
	o, err := t.n.observe(t.pool)
	if err != nil {
		return err
	}
	for _, c := range refused {
		if c.phase != phaseAllocated {
			continue
		}
		if rec := o.claims[string(c.obj.UID)]; rec != nil {
			t.violate("half-done: claim %s (%s): Prepare failed, but the checkpoint holds it (%s)", c.obj.Name, c.kind, rec.Phase)
		}
		if o.specs[string(c.obj.UID)] != nil {
			t.violate("half-done: claim %s (%s): Prepare failed, but its CDI spec is there", c.obj.Name, c.kind)
		}
	}
	return nil
}

// checkNode checks the invariants and records what it finds.
func (t *trial) checkNode(ctx context.Context, when string, final bool) {
	o, err := t.n.observe(t.pool)
	if err != nil {
		t.violate("harness: observe the node %s: %v", when, err)
		return
	}
	found := o.check(t.live, final)
	for _, v := range found {
		t.violate("%s (%s)", v, when)
	}
	if len(found) > 0 {
		t.snapshot()
	}
}

// snapshot copies the node's files as they are when a check fails into
// snapshot-<n> of the trial's directory (kept with -keep): the directory
// itself ends clean after the drain.
func (t *trial) snapshot() {
	t.snapshots++
	dst := filepath.Join(t.n.dir, fmt.Sprintf("snapshot-%d", t.snapshots))
	for _, sub := range []string{"p", "cdi", "sim"} {
		_ = os.CopyFS(filepath.Join(dst, sub), os.DirFS(filepath.Join(t.n.dir, sub)))
	}
	var live []string
	for _, c := range t.live {
		live = append(live, fmt.Sprintf("%s %s phase=%d forced=%v uid=%s %v", c.obj.Name, c.kind, c.phase, c.forced, c.obj.UID, allocated(c.obj.Status.Allocation)))
	}
	slices.Sort(live)
	_ = os.WriteFile(filepath.Join(dst, "live-claims.txt"), []byte(strings.Join(live, "\n")+"\n"), 0o644)
}

// restart starts the plugin again, as the kubelet restarts its pod.
func (t *trial) restart(ctx context.Context) error {
	t.sum.Restarts++
	damaged := damage("")
	if t.rng.Float64() < t.o.LossProbability {
		var err error
		if damaged, err = t.damageCheckpoint(); err != nil {
			return err
		}
	}
	if damaged != "" && t.rng.Float64() < killDuringAdoption {
		// Killed while it finds the loss and adopts the claims.
		delay := time.Duration(t.rng.Float64() * float64(maxAdoptionKillDelay))
		if err := t.n.spawn(); err != nil {
			return err
		}
		time.Sleep(delay)
		t.trace("SIGKILL %v into the start after the checkpoint was %s", delay.Round(time.Millisecond), damaged)
		t.kills++
		t.sum.Kills++
		t.sum.AdoptionKills++
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
		t.checkNode(ctx, fmt.Sprintf("after a kill during the start after the checkpoint was %s", damaged), false)
	} else if t.rng.Float64() < 0.25 {
		// Killed again while it starts: adoption, restore and the first
		// sweep are interrupted too.
		u := t.rng.Float64()
		delay := time.Duration(u * u * float64(300*time.Millisecond))
		if err := t.n.spawn(); err != nil {
			return err
		}
		time.Sleep(delay)
		t.trace("SIGKILL %v into the start", delay.Round(time.Millisecond))
		t.kills++
		t.sum.Kills++
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
		t.checkNode(ctx, "after a kill during the start", false)
	}
	var err error
	for range 3 {
		start := time.Now()
		if err = t.n.start(ctx); err == nil {
			t.trace("restarted in %v", time.Since(start).Round(time.Millisecond))
			return nil
		}
		t.violate("restart: %v", err)
		_ = t.n.kill()
	}
	return err
}

// drain unprepares every claim, as the kubelet does when the pods go,
// and checks that nothing is left.
func (t *trial) drain(ctx context.Context) error {
	for round := 0; round < 40 && len(t.live) > 0; round++ {
		if !t.n.running() {
			if err := t.n.kill(); err != nil {
				t.violate("crash: %v", err)
			}
			if err := t.restart(ctx); err != nil {
				return err
			}
		}
		var calls []*call
		for _, uid := range slices.Sorted(maps.Keys(t.live)) {
			c := t.live[uid]
			c.phase = phaseReleasing
			calls = append(calls, &call{claims: []*claim{c}})
		}
		t.roundTrip(ctx, calls)
		if len(t.live) > 0 {
			time.Sleep(250 * time.Millisecond)
		}
	}
	for _, c := range t.live {
		t.violate("drain: claim %s (%s) could not be unprepared", c.obj.Name, c.kind)
	}
	// MPS daemons stop asynchronously to their Unprepare's return? They
	// must not: give them a moment anyway before counting leaks.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		daemons, err := mpsDaemons(t.n.mpsRoot())
		if err == nil && len(daemons) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.checkNode(ctx, "at the end", true)
	for i := 1; i <= t.n.starts; i++ {
		if t.n.logContains(i, "WARNING: DATA RACE") {
			t.violate("race: the plugin's log %s reports a data race", filepath.Base(t.n.logPath(i)))
		}
		// A write the API server refuses as invalid or unauthorized is a
		// defect of the plugin however it carries on (a status write that
		// fails is only logged): a real API server validates and
		// authorizes every write, the in-repo one neither.
		if line := t.n.logLine(i, "is invalid", "is forbidden", "Unprocessable Entity"); line != "" {
			t.violate("refused: the plugin's log %s reports a write the API server refused: %s", filepath.Base(t.n.logPath(i)), line)
		}
	}
	if _, err := t.waitForPool(ctx, t.initial, 10*time.Second); err != nil {
		list, _ := t.n.listSlices(ctx)
		t.violate("published: at the end the pool has %v, at the start %v", deviceNames(index(list).devices), t.initial)
	}
	return nil
}

var (
	uidPattern   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	claimPattern = regexp.MustCompile(`c[0-9]+-[a-z+-]+`)
	numPattern   = regexp.MustCompile(`[0-9]+`)
)

// normalize makes an error message a category: UIDs, names and numbers
// replaced, cut to a line.
func normalize(msg string) string {
	msg = uidPattern.ReplaceAllString(msg, "<uid>")
	msg = claimPattern.ReplaceAllString(msg, "<claim>")
	msg = numPattern.ReplaceAllString(msg, "N")
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return msg
}

// allocated renders an allocation's devices.
func allocated(a *resourceapi.AllocationResult) []string {
	var out []string
	for _, r := range a.Devices.Results {
		d := r.Device
		if r.ShareID != nil {
			d += "(share)"
		}
		out = append(out, d)
	}
	return out
}
