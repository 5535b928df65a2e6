package metrics_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/metrics"
)

// TestReferenceDocumentsEveryMetric keeps docs/guides/metrics.md in step
// with the code: every metric family the plugin serves, each observed
// once, is named there.
func TestReferenceDocumentsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../../docs/guides/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	state := metrics.State{PreparedClaims: 1, PublishedDevices: map[string]int{"gpu": 1}, MPSDaemons: 1, TaintedDevices: map[string]int{"NoSchedule": 1}, CheckpointWrites: 1,
		PreparedDevices: []metrics.PreparedDevice{{Namespace: "ns", Pod: "pod", Claim: "claim", Request: "gpu", Device: "gpu-0", GPUUUID: "GPU-0"}}}
	p := metrics.NewPlugin(func() metrics.State { return state })
	p.ObservePrepare(time.Millisecond, nil)
	p.ObserveUnprepare(time.Millisecond, nil)
	p.SlicePublishError()
	p.HealthEvent("xid", false)
	families, err := p.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var gpudra int
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, metrics.Namespace+"_") {
			continue // the Go runtime's and the process's
		}
		gpudra++
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/guides/metrics.md does not name %s", name)
		}
	}
	if gpudra < 10 {
		t.Errorf("only %d gpudra metric families gathered: the check checks little", gpudra)
	}
}
