package metrics_test

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/metrics"
)

// dcgmSeries is what DCGM exporter serves for a node with a full H100
// (GPU 0) and an H100 in MIG mode with two MIG devices (GPU 1, GPU
// instances 1 and 9): its label names and values as it writes them.
const dcgmSeries = `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaaaaaa-0000-0000-0000-000000000000",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1"} 87
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-bbbbbbbb-0000-0000-0000-000000000000",pci_bus_id="00000000:43:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1"} 0.25
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-bbbbbbbb-0000-0000-0000-000000000000",pci_bus_id="00000000:43:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="node-1"} 0.75
`

// TestPreparedDeviceInfoJoinsDCGM checks that the info metric, as served,
// joins DCGM exporter's series the way the documented query does:
// gpudra_prepared_device_info * on(UUID, GPU_I_ID) group_left <dcgm>.
// The join is done here as PromQL does it: for each info series, the one
// DCGM series with equal UUID and GPU_I_ID (a missing label is empty).
func TestPreparedDeviceInfoJoinsDCGM(t *testing.T) {
	state := metrics.State{PreparedClaims: 2, PreparedDevices: []metrics.PreparedDevice{
		// Two pods share a claim of the full GPU.
		{Namespace: "ml", Pod: "trainer-0", Claim: "shared-gpu", Request: "gpu", Device: "gpu-0", GPUUUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000"},
		{Namespace: "ml", Pod: "trainer-1", Claim: "shared-gpu", Request: "gpu", Device: "gpu-0", GPUUUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000"},
		// One pod has a MIG device of GPU 1.
		{Namespace: "infer", Pod: "server-0", Claim: "mig", Request: "mig", Device: "gpu-1-mig-1g10gb-6-0",
			GPUUUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", MIGUUID: "MIG-cccccccc-0000-0000-0000-000000000000", GPUInstanceID: "9"},
	}}
	p := metrics.NewPlugin(func() metrics.State { return state })
	rec := httptest.NewRecorder()
	p.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	info := samples(t, rec.Body.String(), "gpudra_prepared_device_info")
	if len(info) != 3 {
		t.Fatalf("served %d gpudra_prepared_device_info series, want 3:\n%s", len(info), rec.Body)
	}
	for _, s := range info {
		if s.value != "1" {
			t.Errorf("info series %v = %s, want 1", s.labels, s.value)
		}
	}

	util := samples(t, dcgmSeries, "DCGM_FI_DEV_GPU_UTIL")
	active := samples(t, dcgmSeries, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
	for _, tc := range []struct {
		dcgm []sample
		// want is pod=value of the joined series.
		want []string
	}{
		{util, []string{"trainer-0=87", "trainer-1=87"}},
		{active, []string{"server-0=0.75"}},
	} {
		var got []string
		for _, i := range info {
			var matched []sample
			for _, d := range tc.dcgm {
				if d.labels["UUID"] == i.labels["UUID"] && d.labels["GPU_I_ID"] == i.labels["GPU_I_ID"] {
					matched = append(matched, d)
				}
			}
			switch len(matched) {
			case 0:
			case 1:
				got = append(got, i.labels["pod"]+"="+matched[0].value)
			default:
				t.Fatalf("info series %v matches %d DCGM series: PromQL would refuse the join", i.labels, len(matched))
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("joined %s = %v, want %v", tc.dcgm[0].name, got, tc.want)
		}
	}
}

// TestPreparedDeviceInfoGoneWithTheCheckpoint checks that a scrape that
// cannot read the checkpoint serves no info series, rather than stale
// ones.
func TestPreparedDeviceInfoGoneWithTheCheckpoint(t *testing.T) {
	p := metrics.NewPlugin(func() metrics.State { return metrics.State{PreparedClaims: -1} })
	rec := httptest.NewRecorder()
	p.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if got := samples(t, rec.Body.String(), "gpudra_prepared_device_info"); len(got) != 0 {
		t.Fatalf("served %v with no checkpoint", got)
	}
}

type sample struct {
	name   string
	labels map[string]string
	value  string
}

// samples parses the series called name from Prometheus text.
func samples(t *testing.T, text, name string) []sample {
	t.Helper()
	var out []sample
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labelText, value, ok := strings.Cut(rest, "} ")
		if !ok {
			t.Fatalf("unparsable series %q", line)
		}
		s := sample{name: name, labels: map[string]string{}, value: value}
		for _, pair := range splitLabels(labelText) {
			k, v, ok := strings.Cut(pair, "=")
			if !ok {
				t.Fatalf("unparsable label %q in %q", pair, line)
			}
			var unq string
			if _, err := fmt.Sscanf(v, "%q", &unq); err != nil {
				t.Fatalf("label value %s in %q: %v", v, line, err)
			}
			s.labels[k] = unq
		}
		out = append(out, s)
	}
	return out
}

// splitLabels splits `a="x",b="y,z"` at the commas between labels.
func splitLabels(s string) []string {
	var out []string
	var cur bytes.Buffer
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted && i+1 < len(s):
			cur.WriteByte(c)
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quoted = !quoted
			cur.WriteByte(c)
		case c == ',' && !quoted:
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}
