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
