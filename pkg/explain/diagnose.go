package explain

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// diagnose takes the pending claims apart after the allocator found no
// node for them all: each request by itself, each claim by itself, then
// what keeps the parts that fit alone from fitting together.
func (a *analyzer) diagnose(ctx context.Context, rep *Report, pending []*resourceapi.ResourceClaim) {
	var claimsFitAlone [][]string
	for _, c := range pending {
		cr := claimReport(rep, c.Name)
		evals := map[string]requestEval{}
		requestsOK := true
		for i := range c.Spec.Devices.Requests {
			r := &c.Spec.Devices.Requests[i]
			ev := a.request(ctx, c, r)
			evals[r.Name] = ev
			cr.Requests = append(cr.Requests, ev.report)
			requestsOK = requestsOK && ev.report.Status == StatusOK
		}
		fit, _, err := a.fit(ctx, []*resourceapi.ResourceClaim{c}, true)
		if err != nil {
			// The same error stopped the allocation of all claims when
			// it is the only claim; say it once.
			if len(pending) > 1 {
				rep.Problems = append(rep.Problems, fmt.Sprintf("claim %s: the scheduler's allocator stops with an error: %v", c.Name, err))
			}
			claimsFitAlone = append(claimsFitAlone, nil)
			continue
		}
		cr.FitNodes = fit
		claimsFitAlone = append(claimsFitAlone, fit)
		if len(fit) == 0 && requestsOK {
			a.together(ctx, rep, cr, c, evals)
		}
	}
	if len(pending) < 2 {
		return
	}
	common := sets.New(a.nodeNames()...)
	for _, fit := range claimsFitAlone {
		if len(fit) == 0 {
			return
		}
		common = common.Intersection(sets.New(fit...))
	}
	var parts []string
	for i, c := range pending {
		parts = append(parts, fmt.Sprintf("%s on %s", c.Name, strings.Join(claimsFitAlone[i], ", ")))
	}
	if common.Len() == 0 {
		rep.Problems = append(rep.Problems, "each claim fits by itself, but on different nodes, and a pod's claims must share one node: "+strings.Join(parts, "; "))
		return
	}
	rep.Problems = append(rep.Problems, fmt.Sprintf("each claim fits by itself (%s), but not all of them at once: on %s they need more of the same devices than are free", strings.Join(parts, "; "), strings.Join(sets.List(common), ", ")))
}

// together explains a claim whose requests each fit by themselves but not
// all at once: nodes that differ, a constraint, or devices they compete
// for.
func (a *analyzer) together(ctx context.Context, rep *Report, cr *ClaimReport, c *resourceapi.ResourceClaim, evals map[string]requestEval) {
	common := sets.New(a.nodeNames()...)
	var parts []string
	for _, r := range cr.Requests {
		common = common.Intersection(sets.New(r.FitNodes...))
		parts = append(parts, fmt.Sprintf("%s on %s", r.Name, strings.Join(r.FitNodes, ", ")))
	}
	if common.Len() == 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("claim %s: each request fits by itself, but on different nodes, and all devices of a claim must be on one node: %s", c.Name, strings.Join(parts, "; ")))
		return
	}
	node := sets.List(common)[0]
	if len(c.Spec.Devices.Constraints) > 0 {
		free := c.DeepCopy()
		free.Spec.Devices.Constraints = nil
		if fit, _, err := a.fit(ctx, []*resourceapi.ResourceClaim{free}, false); err == nil && len(fit) > 0 {
			for i := range c.Spec.Devices.Constraints {
				cr.Constraints = append(cr.Constraints, a.constraint(ctx, c, i, node, evals))
			}
			return
		}
	}
	var asks []string
	for _, r := range c.Spec.Devices.Requests {
		ev := evals[r.Name]
		n := len(ev.free[node])
		if ev.report.Count > 0 {
			asks = append(asks, fmt.Sprintf("%s asks for %d of %d it could have", r.Name, ev.report.Count, n))
		} else {
			asks = append(asks, fmt.Sprintf("%s asks for all %d it could have", r.Name, n))
		}
	}
	rep.Problems = append(rep.Problems, fmt.Sprintf("claim %s: each request fits by itself, but not all at once: on %s %s, and they compete for the same devices", c.Name, node, strings.Join(asks, ", ")))
}

// constraint explains one constraint of a claim that fits once its
// constraints are dropped: it fails if the claim with only this
// constraint fails too.
func (a *analyzer) constraint(ctx context.Context, c *resourceapi.ResourceClaim, i int, node string, evals map[string]requestEval) ConstraintReport {
	con := c.Spec.Devices.Constraints[i]
	rep := ConstraintReport{Requests: con.Requests, Status: StatusOK}
	var attr resourceapi.FullyQualifiedName
	switch {
	case con.MatchAttribute != nil:
		rep.Kind, attr = "matchAttribute", *con.MatchAttribute
	case con.DistinctAttribute != nil:
		rep.Kind, attr = "distinctAttribute", *con.DistinctAttribute
	default:
		rep.Kind, rep.Status, rep.Reason = "unknown", StatusFails, "a constraint of a kind this version does not know"
		return rep
	}
	rep.Attribute = string(attr)
	only := c.DeepCopy()
	only.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{con}
	fit, _, err := a.fit(ctx, []*resourceapi.ResourceClaim{only}, false)
	if err == nil && len(fit) > 0 {
		rep.Reason = "can be met on " + fit[0]
		return rep
	}
	rep.Status = StatusFails
	requests := con.Requests
	if len(requests) == 0 {
		for _, r := range c.Spec.Devices.Requests {
			requests = append(requests, r.Name)
		}
	}
	domain, name, _ := strings.Cut(string(attr), "/")
	ref := attrRef{domain: domain, name: name}
	// For each value of the attribute, how many of each request's free
	// devices on the node have it.
	perValue := map[string]map[string]int{}
	var asks []string
	for _, r := range requests {
		ev := evals[r]
		if ev.report.Count > 0 {
			asks = append(asks, fmt.Sprintf("%s (%d)", r, ev.report.Count))
		} else {
			asks = append(asks, r)
		}
		for _, d := range ev.free[node] {
			v, _, ok := ref.value(d)
			if !ok {
				v = "(none)"
			}
			if perValue[v] == nil {
				perValue[v] = map[string]int{}
			}
			perValue[v][r]++
		}
	}
	var values []string
	for _, v := range slices.Sorted(maps.Keys(perValue)) {
		var per []string
		for _, r := range requests {
			per = append(per, fmt.Sprintf("%d for %s", perValue[v][r], r))
		}
		values = append(values, fmt.Sprintf("%s: %s", v, strings.Join(per, ", ")))
	}
	have := "no free device"
	if len(values) > 0 {
		have = strings.Join(values, "; ")
	}
	want := "all share one value"
	if rep.Kind == "distinctAttribute" {
		want = "each have a different value"
	}
	rep.Reason = fmt.Sprintf("no node has devices for requests %s that %s of %s; the free devices on %s by value: %s", strings.Join(asks, ", "), want, attr, node, have)
	return rep
}

func claimReport(rep *Report, name string) *ClaimReport {
	i := slices.IndexFunc(rep.Claims, func(c ClaimReport) bool { return c.Name == name })
	return &rep.Claims[i]
}

func (a *analyzer) nodeNames() []string {
	names := make([]string, len(a.nodes))
	for i, n := range a.nodes {
		names[i] = n.Name
	}
	return names
}
