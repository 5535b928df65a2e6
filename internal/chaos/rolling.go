package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"time"
)

// Rolling updates: a second plugin instance, of a new pod, starts beside
// the running one and shares its directories (checkpoint, CDI specs, the
// hardware), as a DaemonSet's rolling update with surge runs them; the
// kubelet's calls of the round go to either, some claims are prepared
// through one instance and unprepared through the other at once (their
// pod is deleted while it starts), either instance may be killed, and the
// old one is then stopped (SIGTERM, or SIGKILL) and the new one is the
// node's plugin.
//
// The invariant of such a race (released): when the Unprepare returned
// success after the Prepare returned, nothing is held for the claim. The
// order the harness sees the answers in need not be the order the
// plugins ran the calls in (on a loaded machine the goroutine that takes
// in an answer may run late), so what it checks is what no order
// allows: a CDI spec without a checkpoint entry, or an entry whose time
// (when its preparation finished) is before the Unprepare was sent: the
// Unprepare ran after it was recorded and must have removed it. An entry
// made after that may be a Prepare that ran after the Unprepare; the
// kubelet then unprepares the claim again. A claim that holds nothing is
// gone, so the owned invariant finds anything it left on the hardware.

// racedPair is a Prepare and an Unprepare of one claim through two
// instances at once.
type racedPair struct {
	c               *claim
	prepare, unprep *call
}

// podUID is the UID of the plugin's gen-th pod of the trial.
func (t *trial) podUID(gen int) string {
	return fmt.Sprintf("%08x-%04x-4000-8000-000000000000", uint32(t.seed), gen&0xffff)
}

// rollingStep runs a round during a rolling update; the node's plugin
// runs when it is called.
func (t *trial) rollingStep(ctx context.Context) error {
	oldUID := t.n.podUID
	old := new(proc)
	*old = t.n.proc
	t.rollouts++
	uid := t.podUID(t.rollouts)
	next, err := t.n.spawnInstance(uid)
	if err != nil {
		return err
	}
	if err := t.n.readyProc(ctx, next); err != nil {
		t.violate("restart: the instance of pod %s beside the running one: %v", uid, err)
		_ = t.n.end(next, syscall.SIGKILL)
		return nil // the running instance carries on
	}
	t.n.proc, t.n.podUID = *next, uid
	t.sum.RollingUpdates++
	t.trace("rolling update: the instance of pod %s starts beside the one of pod %s", uid, oldUID)
	calls, err := t.plan(ctx)
	if err != nil {
		return err
	}
	for _, c := range calls {
		c.to = []*proc{old, &t.n.proc}[t.rng.IntN(2)]
	}
	calls, pairs := t.race(calls, old, &t.n.proc)
	wait := t.issue(ctx, calls)
	kill := t.rng.Float64() < t.o.KillProbability
	killNew := t.rng.IntN(2) == 0
	u := t.rng.Float64()
	delay := time.Duration(u * u * u * float64(t.o.MaxKillDelay))
	if kill {
		time.Sleep(delay)
		t.trace("SIGKILL of the %s instance %v after the calls", map[bool]string{true: "new", false: "old"}[killNew], delay.Round(time.Millisecond))
		t.kills++
		t.sum.Kills++
		victim := old
		if killNew {
			victim = &t.n.proc
		}
		if err := t.n.end(victim, syscall.SIGKILL); err != nil {
			t.violate("crash: %v", err)
		}
	}
	wait()
	refused := t.collect(ctx, calls)
	if err := t.settleRaces(ctx, pairs); err != nil {
		return err
	}
	// The old pod goes.
	sig := []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}[t.rng.IntN(2)]
	if err := t.n.end(old, sig); err != nil {
		t.violate("crash: %v", err)
	}
	if (kill && killNew) || !t.n.running() {
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
		t.checkNode(ctx, "after a kill in a rolling update", false)
		return t.restart(ctx)
	}
	return t.checkRefused(ctx, refused)
}

// race takes one or two claims of the round, a new one or a running one,
// out of their calls and gives each a Prepare through one instance and an
// Unprepare through the other, made at once.
func (t *trial) race(calls []*call, a, b *proc) ([]*call, []*racedPair) {
	var candidates []*claim
	inCall := map[*claim]bool{}
	for _, cl := range calls {
		for _, c := range cl.claims {
			inCall[c] = true
			if cl.prepare && c.phase == phaseAllocated {
				candidates = append(candidates, c)
			}
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(t.live)) {
		if c := t.live[uid]; c.phase == phasePrepared && !c.forced && !inCall[c] {
			candidates = append(candidates, c)
		}
	}
	t.rng.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	picked := candidates[:min(len(candidates), 1+t.rng.IntN(2))]
	var out []*call
	for _, cl := range calls {
		cl.claims = slices.DeleteFunc(cl.claims, func(c *claim) bool { return slices.Contains(picked, c) })
		if len(cl.claims) > 0 {
			out = append(out, cl)
		}
	}
	var pairs []*racedPair
	for _, c := range picked {
		to := []*proc{a, b}
		if t.rng.IntN(2) == 0 {
			to[0], to[1] = b, a
		}
		p := &racedPair{c: c,
			prepare: &call{prepare: true, claims: []*claim{c}, to: to[0], raced: true},
			unprep:  &call{claims: []*claim{c}, to: to[1], raced: true},
		}
		t.trace("%s: prepared and unprepared through two instances at once", c.obj.Name)
		t.sum.RacedPairs++
		pairs = append(pairs, p)
		out = append(out, p.prepare, p.unprep)
	}
	return out, pairs
}

// settleRaces takes in the outcomes of raced pairs: a claim whose
// Unprepare succeeded after its Prepare returned is released and must
// hold nothing; otherwise the kubelet unprepares it again.
func (t *trial) settleRaces(ctx context.Context, pairs []*racedPair) error {
	for _, p := range pairs {
		c := p.c
		po, uo := p.prepare.result[c.obj.UID], p.unprep.result[c.obj.UID]
		t.trace("raced %s: prepare %s at %s, unprepare %s at %s", c.obj.Name, po, p.prepare.done.Format("15:04:05.000000"), uo, p.unprep.done.Format("15:04:05.000000"))
		for _, o := range []outcome{po, uo} {
			if o.transport != nil {
				t.sum.TransportErrors++
			} else if o.err != "" {
				t.sum.ClaimErrors++
				t.sum.ErrorMessages[normalize(o.err)]++
			}
		}
		if po.transport == nil && po.err == "" {
			for _, v := range resultMatches(c, po) {
				t.violate("%s", v)
			}
			if c.phase == phaseAllocated {
				t.sum.Prepared[c.kind]++
			}
		}
		if uo.transport != nil || uo.err != "" || !p.unprep.done.After(p.prepare.done) {
			// The pod is gone: the kubelet unprepares the claim again.
			c.phase = phaseReleasing
			continue
		}
		t.sum.UnprepareLast++
		o, err := t.n.observe(t.pool)
		if err != nil {
			return err
		}
		rec, spec := o.claims[string(c.obj.UID)], o.specs[string(c.obj.UID)]
		switch {
		case rec != nil && rec.StartedAt.Before(p.unprep.sent):
			t.violate("released: claim %s (%s): its Unprepare, sent at %s, succeeded after its Prepare through the other instance returned, but the checkpoint holds it (%s at %s)",
				c.obj.Name, c.kind, p.unprep.sent.Format(time.StampMicro), rec.Phase, rec.StartedAt.Format(time.StampMicro))
		case rec == nil && spec != nil:
			t.violate("released: claim %s (%s): its Unprepare succeeded after its Prepare through the other instance returned; the checkpoint does not hold it, but its CDI spec is there", c.obj.Name, c.kind)
		}
		if rec != nil {
			// Prepared after the Unprepare ran (or held in violation):
			// the kubelet unprepares it again.
			t.trace("%s: held after the race (recorded at %s), unprepared again", c.obj.Name, rec.StartedAt.Format(time.StampMicro))
			c.phase = phaseReleasing
			continue
		}
		if err := t.forget(ctx, c); err != nil {
			return err
		}
	}
	return nil
}
