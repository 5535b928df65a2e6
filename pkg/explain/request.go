package explain

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/utils/ptr"
)

// spec is what one exact request or subrequest asks for.
type spec struct {
	// name is the report's name: request, or request/subrequest.
	name string
	// request is the name of the request in the claim.
	request string
	exact   resourceapi.ExactDeviceRequest
}

func exactSpec(r *resourceapi.DeviceRequest) spec {
	return spec{name: r.Name, request: r.Name, exact: *r.Exactly}
}

func subSpec(r *resourceapi.DeviceRequest, sub *resourceapi.DeviceSubRequest) spec {
	return spec{name: r.Name + "/" + sub.Name, request: r.Name, exact: resourceapi.ExactDeviceRequest{
		DeviceClassName: sub.DeviceClassName,
		Selectors:       sub.Selectors,
		AllocationMode:  sub.AllocationMode,
		Count:           sub.Count,
		Tolerations:     sub.Tolerations,
		Capacity:        sub.Capacity,
	}}
}

// count is the number of devices an ExactCount request asks for.
func (s *spec) count() int64 {
	if s.exact.Count == 0 {
		return 1
	}
	return s.exact.Count
}

func (s *spec) all() bool { return s.exact.AllocationMode == resourceapi.DeviceAllocationModeAll }

// requestEval is a request's report and, for the claim-level diagnosis,
// the devices it could have now on each candidate node.
type requestEval struct {
	report RequestReport
	free   map[string][]*device
}

// alone is the claim with only the one request: what the allocator is
// asked to decide whether the request is satisfiable by itself.
func alone(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	c := claim.DeepCopy()
	c.Spec.Devices = resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}
	return c
}

// request explains one request of a claim.
func (a *analyzer) request(ctx context.Context, claim *resourceapi.ResourceClaim, r *resourceapi.DeviceRequest) requestEval {
	if r.Exactly != nil {
		return a.exact(ctx, claim, exactSpec(r))
	}
	ev := requestEval{report: RequestReport{Name: r.Name}}
	rep := &ev.report
	for i := range r.FirstAvailable {
		sub := a.exact(ctx, claim, subSpec(r, &r.FirstAvailable[i]))
		rep.Subrequests = append(rep.Subrequests, sub.report)
		if ev.free == nil && sub.report.Status == StatusOK {
			ev.free = sub.free
		}
	}
	fit, results, err := a.fit(ctx, []*resourceapi.ResourceClaim{alone(claim, *r)}, true)
	switch {
	case err != nil:
		rep.Status, rep.Reason = StatusFails, "the scheduler's allocator stops with an error: "+err.Error()
	case len(fit) == 0:
		rep.Status = StatusFails
		rep.Reason = fmt.Sprintf("none of its %d subrequests can be allocated", len(r.FirstAvailable))
	default:
		rep.Status, rep.FitNodes = StatusOK, fit
		if res := results[0].Devices.Results; len(res) > 0 {
			rep.Chosen = res[0].Request
		}
		rep.Reason = fmt.Sprintf("fits by itself on %s, with subrequest %s", nodeList(fit, len(a.nodes)), rep.Chosen)
	}
	return ev
}

// exact explains one exact request or subrequest: the allocator decides
// whether it fits by itself; CEL and the device states say why not.
func (a *analyzer) exact(ctx context.Context, claim *resourceapi.ResourceClaim, s spec) requestEval {
	ev := requestEval{report: RequestReport{Name: s.name, DeviceClass: s.exact.DeviceClassName, Mode: string(s.exact.AllocationMode)}}
	rep := &ev.report
	if !s.all() {
		rep.Count = s.count()
	}
	if s.exact.Capacity != nil {
		rep.Capacity = map[string]string{}
		for name, q := range s.exact.Capacity.Requests {
			rep.Capacity[string(name)] = q.String()
		}
	}
	rep.Status = StatusFails
	class, ok := a.classes[s.exact.DeviceClassName]
	if !ok {
		rep.Reason = fmt.Sprintf("DeviceClass %q does not exist; %s", s.exact.DeviceClassName, a.nearestClasses(s.exact.DeviceClassName))
		return ev
	}

	var classClauses, reqClauses []clause
	for i, sel := range class.Spec.Selectors {
		if sel.CEL != nil {
			classClauses = append(classClauses, clauses(a.cel, "class "+class.Name, i, sel.CEL.Expression)...)
		}
	}
	for i, sel := range s.exact.Selectors {
		if sel.CEL != nil {
			reqClauses = append(reqClauses, clauses(a.cel, "request", i, sel.CEL.Expression)...)
		}
	}
	for _, c := range slices.Concat(classClauses, reqClauses) {
		if c.compiled.Error != nil {
			rep.Reason = fmt.Sprintf("%s selector %q does not compile: %v", c.from, c.expr, c.compiled.Error)
			return ev
		}
	}

	var exactReq resourceapi.DeviceRequest
	exactReq.Name, exactReq.Exactly = s.request, s.exact.DeepCopy()
	fit, _, fitErr := a.fit(ctx, []*resourceapi.ResourceClaim{alone(claim, exactReq)}, true)

	classEval := evalClauses(ctx, classClauses, a.inv.devices)
	var inClass []*device
	for i, d := range a.inv.devices {
		if classEval.passesAll(i) {
			inClass = append(inClass, d)
		}
	}
	reqEval := evalClauses(ctx, reqClauses, inClass)
	var selected []*device
	for i, d := range inClass {
		if reqEval.passesAll(i) {
			selected = append(selected, d)
		}
	}
	counts, free, capWhy := a.count(s, inClass, selected)
	rep.Devices, ev.free = counts, free

	fatal := classEval.fatal(a.inv.devices)
	if fatal == "" {
		fatal = reqEval.fatal(inClass)
	}
	switch {
	case fitErr != nil && fatal != "":
		rep.Reason = fatal
	case fitErr != nil:
		rep.Reason = "the scheduler's allocator stops with an error: " + fitErr.Error()
	case len(fit) > 0:
		rep.Status, rep.FitNodes = StatusOK, fit
		rep.Reason = fmt.Sprintf("fits by itself on %s; %d of %d matching devices free on %s", nodeList(fit, len(a.nodes)), len(free[fit[0]]), a.onNode(selected, fit[0]), fit[0])
	case len(inClass) == 0:
		cands, cls := a.inv.devices, slices.Concat(classClauses, reqClauses)
		rep.Clauses, rep.Nearest = a.clauseReports(ctx, cands, cls), a.nearest(ctx, cands, cls)
		rep.Reason = fmt.Sprintf("no device in the cluster is of class %s", class.Name) + failingClauses(rep.Clauses, ": none has ", "; none has ") + nearestText(rep.Nearest)
	case len(selected) == 0:
		rep.Clauses, rep.Nearest = a.clauseReports(ctx, inClass, reqClauses), a.nearest(ctx, inClass, reqClauses)
		why := failingClauses(rep.Clauses, " has ", "; none has ")
		if why == "" {
			why = " passes all of the request's selector clauses together, though each passes some"
		}
		rep.Reason = fmt.Sprintf("no device of class %s", class.Name) + why + nearestText(rep.Nearest)
	default:
		rep.Reason = a.shortage(s, counts, selected, capWhy)
	}
	return ev
}

// count narrows the devices of the class down to those the request can
// have now, overall and per candidate node. capWhy is why the first
// selected device without the capacity asked for lacks it.
func (a *analyzer) count(s spec, inClass, selected []*device) (*DeviceCounts, map[string][]*device, string) {
	c := &DeviceCounts{InClass: len(inClass), Selected: len(selected)}
	free := map[string][]*device{}
	withCap := map[string]int{}
	var capWhy string
	for _, d := range selected {
		ever, now, why := capacityCheck(s.exact.Capacity, d)
		if !ever {
			if capWhy == "" {
				capWhy = d.label() + ": " + why
			}
			continue
		}
		c.WithCapacity++
		for n := range d.nodes {
			withCap[n]++
		}
		usable := d.state == stateFree || (d.state == stateShared && now) ||
			(ptr.Deref(s.exact.AdminAccess, false) && d.state != stateCountersUsedUp)
		switch {
		case !usable && d.state == stateShared:
			c.InUse++
		case !usable && d.state == stateInUse:
			c.InUse++
		case !usable:
			c.CountersUsedUp++
		case tainted(d, s.exact.Tolerations):
			c.Tainted++
		default:
			c.Free++
			for n := range d.nodes {
				free[n] = append(free[n], d)
			}
		}
	}
	for _, n := range a.nodes {
		if withCap[n.Name] > c.MostOnANode {
			c.MostOnANode, c.MostOnANodeName = withCap[n.Name], n.Name
		}
		if len(free[n.Name]) > c.MostFreeOnANode {
			c.MostFreeOnANode, c.MostFreeOnANodeName = len(free[n.Name]), n.Name
		}
		enough := int64(len(free[n.Name])) >= s.count()
		if s.all() {
			enough = withCap[n.Name] > 0 && len(free[n.Name]) == withCap[n.Name]
		}
		if enough {
			c.NodesWithEnough++
		}
	}
	return c, free, capWhy
}

// tainted reports whether the device has a NoSchedule or NoExecute taint
// the request does not tolerate.
func tainted(d *device, tolerations []resourceapi.DeviceToleration) bool {
	for _, t := range d.api.Taints {
		if t.Effect != resourceapi.DeviceTaintEffectNoSchedule && t.Effect != resourceapi.DeviceTaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(tolerations, func(tol resourceapi.DeviceToleration) bool { return resourceclaim.ToleratesTaint(tol, t) }) {
			return true
		}
	}
	return false
}

// shortage explains a request whose selectors some devices pass: too
// little capacity, too few devices on any one node, too few free.
func (a *analyzer) shortage(s spec, c *DeviceCounts, selected []*device, capWhy string) string {
	class := s.exact.DeviceClassName
	narrowed := fmt.Sprintf("the cluster has %d", c.InClass)
	if c.Selected < c.InClass {
		narrowed += fmt.Sprintf(", %d pass the request's selectors", c.Selected)
	}
	if c.WithCapacity < c.Selected {
		narrowed += fmt.Sprintf(", %d have the capacity asked for", c.WithCapacity)
	}
	asks := fmt.Sprintf("asks for %d devices of class %s", s.count(), class)
	if s.count() == 1 {
		asks = "asks for 1 device of class " + class
	}
	if s.all() {
		asks = "asks for all devices of class " + class + " that pass its selectors on one node"
	}
	if s.exact.Capacity != nil && len(s.exact.Capacity.Requests) > 0 {
		var caps []string
		for name, q := range s.exact.Capacity.Requests {
			caps = append(caps, fmt.Sprintf("%s %s", name, q.String()))
		}
		sort.Strings(caps)
		asks += " with " + strings.Join(caps, ", ")
		if s.count() > 1 || s.all() {
			asks += " each"
		}
	}
	switch {
	case c.WithCapacity == 0:
		return fmt.Sprintf("%s; none of the %d devices that pass the selectors can give that much (%s)", asks, c.Selected, capWhy)
	case !s.all() && int64(c.MostOnANode) < s.count():
		return fmt.Sprintf("%s; %s, at most %d on one node%s; 0 nodes can satisfy it", asks, narrowed, c.MostOnANode, parenthesized(c.MostOnANodeName))
	case c.NodesWithEnough == 0 && s.all():
		return fmt.Sprintf("%s; no node has them all free: %s has %d, %d free (%s)", asks, c.MostOnANodeName, c.MostOnANode, a.freeOn(selected, c.MostOnANodeName), a.busy(c, selected))
	case c.NodesWithEnough == 0 && c.Free == 0:
		return fmt.Sprintf("%s; %s, none of them free (%s)", asks, narrowed, a.busy(c, selected))
	case c.NodesWithEnough == 0:
		return fmt.Sprintf("%s; %s, %d of them free (%s), at most %d on one node%s", asks, narrowed, c.Free, a.busy(c, selected), c.MostFreeOnANode, parenthesized(c.MostFreeOnANodeName))
	}
	for _, n := range a.nodes {
		if int64(len(a.freeDevices(selected, n.Name))) >= s.count() && consumesCounters(selected, n.Name) {
			return fmt.Sprintf("%s; %s, %d free on %s, but they draw on the same shared counters (MIG placements of one GPU overlap, a GPU and its MIG devices exclude each other), so not %d of them at once", asks, narrowed, len(a.freeDevices(selected, n.Name)), n.Name, s.count())
		}
	}
	return fmt.Sprintf("%s; %s and %d nodes have enough free devices, yet the scheduler's allocator finds no placement", asks, narrowed, c.NodesWithEnough)
}

// busy breaks down why devices that match are not free, naming who
// holds them.
func (a *analyzer) busy(c *DeviceCounts, selected []*device) string {
	holders := map[deviceState]map[string]int{}
	for _, d := range selected {
		if d.holder == "" {
			continue
		}
		if holders[d.state] == nil {
			holders[d.state] = map[string]int{}
		}
		holders[d.state][d.holder]++
	}
	var parts []string
	if c.InUse > 0 {
		byHolder := holders[stateInUse]
		for h, n := range holders[stateShared] {
			if byHolder == nil {
				byHolder = map[string]int{}
			}
			byHolder[h] += n
		}
		parts = append(parts, fmt.Sprintf("%d held by other claims: %s", c.InUse, counted(byHolder)))
	}
	if c.CountersUsedUp > 0 {
		parts = append(parts, fmt.Sprintf("%d blocked by shared counters that other claims' devices use: %s", c.CountersUsedUp, counted(holders[stateCountersUsedUp])))
	}
	if c.Tainted > 0 {
		parts = append(parts, fmt.Sprintf("%d tainted and not tolerated", c.Tainted))
	}
	if len(parts) == 0 {
		return "none held by other claims"
	}
	return strings.Join(parts, "; ")
}

// counted lists holders with how many devices each holds, most first, at
// most four.
func counted(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var out []string
	for i, k := range keys {
		if i == 4 {
			out = append(out, fmt.Sprintf("and %d more", len(keys)-4))
			break
		}
		out = append(out, fmt.Sprintf("%s (%d)", k, m[k]))
	}
	return strings.Join(out, ", ")
}

func (a *analyzer) freeDevices(devs []*device, node string) []*device {
	var out []*device
	for _, d := range devs {
		if d.nodes.Has(node) && d.state == stateFree {
			out = append(out, d)
		}
	}
	return out
}

func (a *analyzer) freeOn(devs []*device, node string) int { return len(a.freeDevices(devs, node)) }

func (a *analyzer) onNode(devs []*device, node string) int {
	n := 0
	for _, d := range devs {
		if d.nodes.Has(node) {
			n++
		}
	}
	return n
}

func consumesCounters(devs []*device, node string) bool {
	for _, d := range devs {
		if d.nodes.Has(node) && len(d.api.ConsumesCounters) > 0 {
			return true
		}
	}
	return false
}

func parenthesized(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// nodeList names the nodes: "2 of 3 nodes (a, b)".
func nodeList(nodes []string, of int) string {
	return fmt.Sprintf("%d of %d nodes (%s)", len(nodes), of, strings.Join(nodes, ", "))
}
