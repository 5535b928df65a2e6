package cluster

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpudra/gpudra/localcluster/simnode"
)

// tableWidth is the width the table keeps to, in columns.
const tableWidth = 100

// Column widths past which a pod's or container's name gets a line of
// its own rather than pushing the other columns to the right.
const (
	maxPodColumn       = 44
	maxContainerColumn = 16
)

// WriteTable writes the report for people: for each pod, a row with its
// phase, node and devices, then, for each container that got devices,
// what it got: CDI devices, device nodes, environment, mounts, MPS daemons
// with their caps and time slices; a pod that is not running gets its
// reason. Then the workloads and the objects the API server refused. Long
// values are wrapped so that no line is wider than tableWidth (a single
// word wider than that is cut).
func (r *Report) WriteTable(w io.Writer) {
	t := &table{w: w}
	podCol := len("POD")
	phaseCol, nodeCol := len("PHASE"), len("NODE")
	for _, p := range r.Pods {
		if n := len(p.Namespace) + 1 + len(p.Name); n <= maxPodColumn {
			podCol = max(podCol, n)
		}
		phaseCol, nodeCol = max(phaseCol, len(tablePhase(p))), max(nodeCol, len(p.Node))
	}
	row := func(pod, phase, node string) string {
		return fmt.Sprintf("%-*s  %-*s  %-*s  ", podCol, pod, phaseCol, phase, nodeCol, node)
	}
	t.line(row("POD", "PHASE", "NODE") + "DEVICES")
	for _, p := range r.Pods {
		pod := p.Namespace + "/" + p.Name
		node := p.Node
		if node == "" {
			node = "-"
		}
		var devices []string
		for _, c := range p.Claims {
			for _, res := range c.Results {
				devices = append(devices, res.Device)
			}
		}
		if len(devices) == 0 {
			devices = []string{"-"}
		}
		if len(pod) > podCol {
			t.wrap("", "", []string{pod})
			pod = ""
		}
		t.wrap(row(pod, tablePhase(p), node), "", devices)
		t.containers(p.Containers)
		if p.Reason != "" {
			t.wrap("  reason: ", "", strings.Fields(p.Reason))
		}
	}
	if len(r.Workloads) > 0 {
		t.line("")
		nameCol := len("WORKLOAD")
		for _, wl := range r.Workloads {
			if n := len(wl.String()); n <= maxPodColumn+10 {
				nameCol = max(nameCol, n)
			}
		}
		t.line(fmt.Sprintf("%-*s  %-8s  %s", nameCol, "WORKLOAD", "PODS", "NOTE"))
		for _, wl := range r.Workloads {
			name := wl.String()
			if len(name) > nameCol {
				t.wrap("", "", []string{name})
				name = ""
			}
			note := strings.Fields(wl.Message)
			if len(note) == 0 {
				note = []string{"-"}
			}
			t.wrap(fmt.Sprintf("%-*s  %-8s  ", nameCol, name, fmt.Sprintf("%d of %d", wl.Pods, wl.Desired)), "", note)
		}
	}
	t.computeDomains(r.ComputeDomains)
	t.taints(r.Nodes)
	if len(r.Refused) > 0 {
		t.line("")
		t.line("REFUSED (not applied; the API server's reason below each)")
		for _, ref := range r.Refused {
			name := ref.Name
			if ref.Namespace != "" {
				name = ref.Namespace + "/" + name
			}
			t.wrap("", "", []string{ref.Kind, name, "(" + ref.Source + ")"})
			t.wrap("  ", "", strings.Fields(ref.Reason))
		}
	}
}

// tablePhase is the pod's phase, or Evicted for a pod a controller evicted
// and deleted.
func tablePhase(p PodReport) string {
	if p.Evicted != nil && p.Evicted.Deleted {
		return "Evicted"
	}
	return p.Phase
}

// computeDomains prints each ComputeDomain's status, channel and nodes
// (by IMEX index), wrapped like the pods' devices.
func (t *table) computeDomains(cds []ComputeDomainReport) {
	if len(cds) == 0 {
		return
	}
	t.line("")
	nameCol := len("COMPUTEDOMAIN")
	for _, cd := range cds {
		if n := len(cd.Namespace) + 1 + len(cd.Name); n <= maxPodColumn {
			nameCol = max(nameCol, n)
		}
	}
	t.line(fmt.Sprintf("%-*s  %-8s  %-7s  %s", nameCol, "COMPUTEDOMAIN", "STATUS", "CHANNEL", "NODES"))
	for _, cd := range cds {
		name := cd.Namespace + "/" + cd.Name
		if len(name) > nameCol {
			t.wrap("", "", []string{name})
			name = ""
		}
		channel := "-"
		if cd.Channel >= 0 {
			channel = strconv.Itoa(cd.Channel)
		}
		status := cmp.Or(cd.Status, "-")
		nodes := []string{fmt.Sprintf("%d of %d:", len(cd.Nodes), cd.NumNodes)}
		if cd.NumNodes == 0 {
			nodes = []string{fmt.Sprintf("%d:", len(cd.Nodes))}
		}
		nodes = append(nodes, cd.Nodes...)
		t.wrap(fmt.Sprintf("%-*s  %-8s  %-7s  ", nameCol, name, status, channel), "", nodes)
		if cd.Reason != "" {
			t.wrap("  reason: ", "", strings.Fields(cd.Reason))
		}
	}
}

// containers prints what each container with devices got, one kind of
// thing per label, under the container's name.
func (t *table) containers(ctrs []ContainerReport) {
	col := 0
	for _, c := range ctrs {
		if len(c.Name) <= maxContainerColumn {
			col = max(col, len(c.Name))
		}
	}
	for _, c := range ctrs {
		if len(c.CDIDevices) == 0 && c.Seen == nil {
			continue
		}
		var env []string
		for _, k := range slices.Sorted(maps.Keys(c.Env)) {
			env = append(env, k+"="+c.Env[k])
		}
		var mps, slice []string
		for _, m := range c.MPS {
			mps = append(mps, strings.Fields(simnode.MPSCaps(m))...)
		}
		for _, ts := range c.TimeSlices {
			slice = append(slice, fmt.Sprintf("%s (%s): %s", ts.Device, ts.GPU, ts.Interval))
		}
		var health []string
		for _, rs := range c.AllocatedResourcesStatus {
			for _, h := range rs.Resources {
				value := string(h.Health)
				if h.Health == corev1.ResourceHealthStatusUnknown {
					// What the kubelet says of a device whose driver
					// reports no health (the simulated NIC driver's).
					value += " (not reported)"
				}
				health = append(health, fmt.Sprintf("%s=%s", rs.Name, value), "("+string(h.ResourceID)+")")
			}
		}
		// What a real node's container printed itself: its device nodes
		// and the NVIDIA and CUDA variables of its environment.
		var seenNodes, seenEnv []string
		if c.Seen != nil {
			seenNodes = c.Seen.DeviceNodes
			for _, k := range slices.Sorted(maps.Keys(c.Seen.Env)) {
				if strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "CUDA_") {
					seenEnv = append(seenEnv, k+"="+c.Seen.Env[k])
				}
			}
			if c.Seen.MPSPipeDirectory != "" {
				seenEnv = append(seenEnv, "(MPS pipe directory "+c.Seen.MPSPipeDirectory+" exists)")
			}
		}
		name := c.Name
		if len(name) > col {
			t.wrap("  ", "", []string{name})
			name = ""
		}
		first := true
		for _, item := range []struct {
			label  string
			values []string
		}{
			{"cdi", c.CDIDevices}, {"nodes", c.DeviceNodes}, {"env", env}, {"mounts", c.Mounts}, {"mps", mps}, {"slice", slice}, {"health", health},
			{"saw", seenNodes}, {"saw", seenEnv},
		} {
			if len(item.values) == 0 {
				continue
			}
			who := ""
			if first {
				who, first = name, false
			}
			t.wrap(fmt.Sprintf("  %-*s  %-6s  ", col, who, item.label), "", item.values)
		}
	}
}

// taints prints the nodes' device taints, if any device has one.
func (t *table) taints(nodes []NodeReport) {
	col, found := len("NODE"), false
	for _, n := range nodes {
		if len(n.DeviceTaints) > 0 {
			col, found = max(col, len(n.Name)), true
		}
	}
	if !found {
		return
	}
	t.line("")
	t.line(fmt.Sprintf("%-*s  %s", col, "NODE", "DEVICE TAINTS"))
	for _, n := range nodes {
		for _, dt := range n.DeviceTaints {
			t.wrap(fmt.Sprintf("%-*s  ", col, n.Name), "", []string{dt.Device, dt.Key + "=" + dt.Value + ":" + dt.Effect})
		}
	}
}

// table writes lines of at most tableWidth columns.
type table struct {
	w io.Writer
}

func (t *table) line(s string) { fmt.Fprintln(t.w, strings.TrimRight(s, " ")) }

// wrap writes the words after prefix, separated by spaces, as many to a
// line as fit; continuation lines are indented to the prefix's width (or
// by indent, if given, or by 4 when the prefix leaves less than 30
// columns). A word that does not fit there but would on a line of its
// own, indented by 4, gets one (a CDI ID is never cut); a word longer
// than that is cut.
func (t *table) wrap(prefix, indent string, words []string) {
	if len(prefix) > tableWidth-20 {
		// Columns this wide (very long names) leave no room: wrap them
		// like the rest.
		words = append(strings.Fields(prefix), words...)
		prefix, indent = "", "    "
	}
	if indent == "" {
		indent = strings.Repeat(" ", len(prefix))
		if len(prefix) > tableWidth-30 {
			indent = "    "
		}
	}
	var b strings.Builder
	b.WriteString(prefix)
	n, empty := len(prefix), true
	// ownLine: the last word went on a line of its own, and nothing
	// waits to be written.
	ownLine := false
	flush := func() {
		t.line(b.String())
		b.Reset()
		b.WriteString(indent)
		n, empty = len(indent), true
	}
	for _, word := range words {
		sep := 1
		if empty {
			sep = 0
		}
		if !empty && n+sep+len(word) > tableWidth {
			flush()
			sep = 0
		}
		if n+sep+len(word) > tableWidth && len(word) <= tableWidth-4 {
			// A word (a CDI ID) that fits on a line of its own, less
			// indented, is not cut.
			if strings.TrimSpace(b.String()) != "" {
				flush()
			}
			t.line(strings.Repeat(" ", 4) + word)
			ownLine = true
			continue
		}
		ownLine = false
		for n+sep+len(word) > tableWidth {
			if !empty || n+sep >= tableWidth {
				flush()
				sep = 0
			}
			room := tableWidth - n - sep
			b.WriteString(strings.Repeat(" ", sep) + word[:room])
			word = word[room:]
			flush()
		}
		b.WriteString(strings.Repeat(" ", sep) + word)
		n += sep + len(word)
		empty = false
	}
	if !ownLine {
		t.line(b.String())
	}
}
