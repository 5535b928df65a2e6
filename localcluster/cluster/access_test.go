package cluster

import (
	"fmt"
	"slices"
	"testing"
)

func TestPluginEndpointLines(t *testing.T) {
	const head = "gpudra's plugin on each node: metrics at /metrics, probes at /livez, /healthz, /readyz"
	fleet := func(n int) []NodeReport {
		var out []NodeReport
		for i := range n {
			out = append(out, NodeReport{Name: fmt.Sprintf("node-%d", i), HTTPEndpoint: fmt.Sprintf("http://127.0.0.1:%d", 40000+i)})
		}
		return out
	}
	withReal := append([]NodeReport{{Name: "real-0", Real: true, HTTPEndpoint: "http://127.0.0.1:39999"}, {Name: "a100-classic"}}, fleet(1)...)
	for _, tc := range []struct {
		name  string
		nodes []NodeReport
		want  []string
	}{
		{name: "none serve one", nodes: []NodeReport{{Name: "a100-classic"}}},
		{name: "few", nodes: fleet(2), want: []string{head,
			"  node-0  http://127.0.0.1:40000/metrics",
			"  node-1  http://127.0.0.1:40001/metrics"}},
		{name: "real node and device plugin node", nodes: withReal, want: []string{head,
			"  real-0  http://127.0.0.1:39999/metrics (real node)",
			"  node-0  http://127.0.0.1:40000/metrics"}},
		{name: "big fleet", nodes: fleet(1000), want: []string{head,
			"  node-0  http://127.0.0.1:40000/metrics",
			"  node-1  http://127.0.0.1:40001/metrics",
			"  node-2  http://127.0.0.1:40002/metrics",
			"  ... and 997 more: see the report"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PluginEndpointLines(tc.nodes, 3, "see the report")
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestContainerAccessLines(t *testing.T) {
	const sim = "Simulated nodes run nothing in the pods: kubectl logs shows what each container was given; exec, attach and port-forward are refused."
	for _, tc := range []struct {
		name  string
		nodes []NodeReport
		want  []string
	}{
		{name: "simulated only", nodes: []NodeReport{{Name: "a"}, {Name: "b"}}, want: []string{sim}},
		{name: "real and simulated", nodes: []NodeReport{{Name: "r", Real: true}, {Name: "a"}, {Name: "b"}}, want: []string{
			"The 2 simulated nodes run nothing in the pods: kubectl logs shows what each container was given; exec, attach and port-forward are refused.",
			"Real nodes (r) run the containers (containerd, runc): kubectl logs and exec reach the real kubelet there, e.g. kubectl logs -n real-node probe-r.",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ContainerAccessLines(tc.nodes); !slices.Equal(got, tc.want) {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
