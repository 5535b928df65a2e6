package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestParseHealthEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
		want []ScheduledHealthEvent
		// wantErrs are what the error must say, each.
		wantErrs []string
	}{{
		name: "every kind",
		text: `- {after: 0s, node: n1, gpu: 0, event: xid:79}
- after: 1m30s
  node: n2
  gpu: 7
  event: ecc-dbe
- {after: 500ms, node: n1, gpu: 1, event: gpu-lost}
- {after: 2s, node: n1, gpu: 1, event: recover}
`,
		want: []ScheduledHealthEvent{
			{After: 0, Node: "n1", GPU: 0, Event: sim.HealthEvent{Kind: sim.InjectXID, XID: 79}, Source: "f.yaml:1"},
			{After: 90 * time.Second, Node: "n2", GPU: 7, Event: sim.HealthEvent{Kind: sim.InjectECCDBE}, Source: "f.yaml:2"},
			{After: 500 * time.Millisecond, Node: "n1", GPU: 1, Event: sim.HealthEvent{Kind: sim.InjectGPULost}, Source: "f.yaml:6"},
			{After: 2 * time.Second, Node: "n1", GPU: 1, Event: sim.HealthEvent{Kind: sim.InjectRecover}, Source: "f.yaml:7"},
		},
	}, {
		name: "empty file",
		text: "",
	}, {
		name:     "not a list",
		text:     "after: 1s\n",
		wantErrs: []string{"f.yaml:1: must be a list of {after, node, gpu, event}"},
	}, {
		name: "bad values, each named with its line",
		text: `- {after: soon, node: n1, gpu: 0, event: xid:79}
- {after: 1s, node: n1, gpu: -1, event: xid:79}
- {after: 1s, node: n1, gpu: 0, event: melted}
- {after: 1s, node: n1, gpu: 0, event: "xid:0"}
- {after: -1s, node: n1, gpu: 0, event: recover}
`,
		wantErrs: []string{
			`f.yaml:1: after: "soon" is not a duration of zero or more (as in 500ms, 2s, 1m30s)`,
			`f.yaml:2: gpu: "-1" is not a GPU index`,
			`f.yaml:3: event: health event "melted": must be one of xid:<n>, ecc-dbe, gpu-lost, recover`,
			`f.yaml:4: event: health event "xid:0": the XID must be a positive number`,
			`f.yaml:5: after: "-1s"`,
		},
	}, {
		name: "unknown and missing fields",
		text: `- after: 1s
  node: n1
  gpus: 0
  event: recover
- just text
`,
		wantErrs: []string{
			`f.yaml:3: unknown field "gpus"; the fields are after, node, gpu, event`,
			`f.yaml:1: missing field "gpu"`,
			`f.yaml:5: an entry must be a map with the fields after, node, gpu, event`,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHealthEvents([]byte(tc.text), "f.yaml")
			if len(tc.wantErrs) > 0 {
				if err == nil {
					t.Fatalf("no error; got %+v", got)
				}
				for _, want := range tc.wantErrs {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error lacks %q:\n%v", want, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d events %+v, want %d", len(got), got, len(tc.want))
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.After != w.After || g.Node != w.Node || g.GPU != w.GPU || g.Event.String() != w.Event.String() || g.Source != w.Source {
					t.Errorf("event %d: got %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func TestCheckHealthEvents(t *testing.T) {
	fleet, err := simfleet.Parse([]byte("nodes:\n- name: n1\n  gpus: [{model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}]\n"), "fleet")
	if err != nil {
		t.Fatal(err)
	}
	events, err := ParseHealthEvents([]byte(`- {after: 1s, node: n1, gpu: 1, event: recover}
- {after: 1s, node: n2, gpu: 0, event: recover}
- {after: 1s, node: n1, gpu: 2, event: recover}
`), "f.yaml")
	if err != nil {
		t.Fatal(err)
	}
	err = CheckHealthEvents(events, fleet)
	for _, want := range []string{
		`f.yaml:2: node: "n2" is not in the fleet; its nodes are n1`,
		`f.yaml:3: gpu: node n1 has GPUs 0 to 1, not 2`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if err != nil && strings.Contains(err.Error(), "f.yaml:1") {
		t.Errorf("the valid entry was refused: %v", err)
	}
}
