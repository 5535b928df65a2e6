package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Formats lists the output formats, the default first.
var Formats = []string{"text", "json"}

// Write renders the report as text or JSON.
func Write(w io.Writer, format string, rep *Report) error {
	switch format {
	case "text":
		_, err := io.WriteString(w, Text(rep))
		return err
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return fmt.Errorf("unknown output format %q: supported values: %s", format, strings.Join(Formats, ", "))
}

// Text renders the report for people.
func Text(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s/%s: %s\n", rep.Kind, rep.Namespace, rep.Name, rep.Summary)
	if rep.Phase != "" {
		fmt.Fprintf(&b, "  phase %s", rep.Phase)
		if rep.NodeName != "" {
			fmt.Fprintf(&b, " on %s", rep.NodeName)
		}
		b.WriteString("\n")
	}
	if rep.SchedulerMessage != "" {
		fmt.Fprintf(&b, "  scheduler says: %s\n", rep.SchedulerMessage)
	}
	writeExcluded(&b, rep.ExcludedNodes)
	for _, w := range rep.Warnings {
		fmt.Fprintf(&b, "  warning: %s\n", w)
	}
	for _, n := range rep.Notices {
		fmt.Fprintf(&b, "  node %s offers fewer devices (%s): %s\n", n.Node, n.Reason, n.Message)
	}
	for _, p := range rep.Placement {
		fmt.Fprintf(&b, "  would allocate: claim %s request %s -> %s\n", p.Claim, p.Request, p.where())
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "  problem: %s\n", p)
	}
	for i := range rep.Claims {
		writeClaim(&b, &rep.Claims[i], rep.Verdict)
	}
	return b.String()
}

// maxExcludedNames is how many excluded nodes a line names before it
// counts the rest.
const maxExcludedNames = 5

// writeExcluded writes one line per reason nodes were not considered for,
// in the order the reasons first appear: on a fleet, a pod's node
// selector excludes most nodes for the same reason.
func writeExcluded(b *strings.Builder, excluded []NodeExclusion) {
	var reasons []string
	nodes := map[string][]string{}
	for _, x := range excluded {
		if _, ok := nodes[x.Reason]; !ok {
			reasons = append(reasons, x.Reason)
		}
		nodes[x.Reason] = append(nodes[x.Reason], x.Node)
	}
	for _, reason := range reasons {
		names := nodes[reason]
		if len(names) == 1 {
			fmt.Fprintf(b, "  node %s not considered: %s\n", names[0], reason)
			continue
		}
		list := strings.Join(names[:min(len(names), maxExcludedNames)], ", ")
		if len(names) > maxExcludedNames {
			list += fmt.Sprintf(" and %d more", len(names)-maxExcludedNames)
		}
		fmt.Fprintf(b, "  %d nodes not considered (%s): %s\n", len(names), list, reason)
	}
}

func (p PlacedDevice) where() string {
	if p.Node != "" {
		return p.Node + "/" + p.Device
	}
	return p.Pool + "/" + p.Device
}

func writeClaim(b *strings.Builder, c *ClaimReport, verdict Verdict) {
	fmt.Fprintf(b, "  claim %s", c.Name)
	switch {
	case c.Template != "" && !c.Created:
		fmt.Fprintf(b, " (from template %s, not created yet)", c.Template)
	case c.Template != "":
		fmt.Fprintf(b, " (from template %s)", c.Template)
	}
	switch {
	case len(c.Allocated) > 0:
		b.WriteString(": allocated\n")
		for _, p := range c.Allocated {
			fmt.Fprintf(b, "    request %s -> %s\n", p.Request, p.where())
		}
		return
	case verdict != VerdictFails:
		b.WriteString(": not allocated yet\n")
		return
	case len(c.FitNodes) > 0:
		fmt.Fprintf(b, ": fits by itself on %s\n", strings.Join(c.FitNodes, ", "))
	default:
		b.WriteString(": fits on no node\n")
	}
	for i := range c.Requests {
		writeRequest(b, &c.Requests[i], "    ")
	}
	for _, k := range c.Constraints {
		fmt.Fprintf(b, "    constraint %s %s: %s: %s\n", k.Kind, k.Attribute, statusText(k.Status), k.Reason)
	}
}

func statusText(s Status) string {
	if s == StatusOK {
		return "ok"
	}
	return "FAILS"
}

func writeRequest(b *strings.Builder, r *RequestReport, indent string) {
	what := "request"
	if strings.Contains(r.Name, "/") {
		what = "subrequest"
	}
	if len(r.Subrequests) > 0 {
		fmt.Fprintf(b, "%s%s %s (firstAvailable): %s: %s\n", indent, what, r.Name, statusText(r.Status), r.Reason)
		for i := range r.Subrequests {
			writeRequest(b, &r.Subrequests[i], indent+"  ")
		}
		return
	}
	fmt.Fprintf(b, "%s%s %s: %s: %s\n", indent, what, r.Name, statusText(r.Status), r.Reason)
	if r.Status == StatusOK {
		return
	}
	for _, c := range r.Clauses {
		switch {
		case c.Error != "":
			fmt.Fprintf(b, "%s  %s clause %s: CEL error %s\n", indent, c.From, c.Text, c.Error)
		case len(c.Values) > 0:
			fmt.Fprintf(b, "%s  %s clause %s: %d of %d pass; %s values: %s\n", indent, c.From, c.Text, c.Passed, c.Of, c.Attribute, strings.Join(limit(c.Values, 20), ", "))
		default:
			fmt.Fprintf(b, "%s  %s clause %s: %d of %d pass\n", indent, c.From, c.Text, c.Passed, c.Of)
		}
	}
	if n := r.Nearest; n != nil {
		fmt.Fprintf(b, "%s  nearest device: %s, %s, passes %d of %d clauses, fails %s\n", indent, PlacedDevice{Node: n.Node, Pool: n.Pool, Device: n.Device}.where(), n.State, n.Passes, n.Of, strings.Join(n.Failing, " and "))
	}
}

func limit(values []string, n int) []string {
	if len(values) <= n {
		return values
	}
	return append(values[:n:n], fmt.Sprintf("... %d more", len(values)-n))
}
