package cluster

import (
	"fmt"
	"strings"
)

// PluginEndpointLines says where the nodes' plugins serve metrics and
// probes, for people: a line naming the paths, then one line per node for
// the first show nodes with an endpoint, then one saying how many more
// there are and where they are listed (more, e.g. "the report's
// nodes[].httpEndpoint"). None when no node serves one.
func PluginEndpointLines(nodes []NodeReport, show int, more string) []string {
	var serving []NodeReport
	col := 0
	for _, n := range nodes {
		if n.HTTPEndpoint != "" {
			serving = append(serving, n)
			if len(serving) <= show {
				col = max(col, len(n.Name))
			}
		}
	}
	if len(serving) == 0 {
		return nil
	}
	lines := []string{"gpudra's plugin on each node: metrics at /metrics, probes at /livez, /healthz, /readyz"}
	for i, n := range serving {
		if i == show {
			lines = append(lines, fmt.Sprintf("  ... and %d more: %s", len(serving)-show, more))
			break
		}
		kind := ""
		if n.Real {
			kind = " (real node)"
		}
		lines = append(lines, strings.TrimRight(fmt.Sprintf("  %-*s  %s/metrics%s", col, n.Name, n.HTTPEndpoint, kind), " "))
	}
	return lines
}

// ContainerAccessLines says for people what kubectl logs, exec, attach and
// port-forward do on the nodes: a simulated node runs no containers (its
// kubelet API answers logs with what each container was given and refuses
// the rest); a real node runs them, and its kubelet serves them.
func ContainerAccessLines(nodes []NodeReport) []string {
	var real []string
	simulated := 0
	for _, n := range nodes {
		if n.Real {
			real = append(real, n.Name)
		} else {
			simulated++
		}
	}
	var lines []string
	if simulated > 0 {
		what := "Simulated nodes run nothing in the pods"
		if len(real) > 0 {
			what = fmt.Sprintf("The %d simulated nodes run nothing in the pods", simulated)
		}
		lines = append(lines, what+": kubectl logs shows what each container was given; exec, attach and port-forward are refused.")
	}
	if len(real) > 0 {
		lines = append(lines, fmt.Sprintf("Real nodes (%s) run the containers (containerd, runc): kubectl logs and exec reach the real kubelet there, e.g. kubectl logs -n %s probe-%s.",
			strings.Join(real, ", "), RealNodeProbeNamespace, real[0]))
	}
	return lines
}
