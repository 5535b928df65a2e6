package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/gpudra/gpudra/pkg/metrics"
)

func scrape(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// The metrics are served in the text format, follow Prometheus' naming
// rules (promlint), show the state read at scrape time, and the probes
// answer: /readyz 503 with the reason until ready, then 200.
func TestServer(t *testing.T) {
	state := metrics.State{PreparedClaims: 3, PublishedDevices: map[string]int{"gpu": 8, "mig": 40}, MPSDaemons: 2, TaintedDevices: map[string]int{"NoExecute": 9}, CheckpointWrites: 7, CheckpointWriteErrors: 1}
	p := metrics.NewPlugin(func() metrics.State { return state })
	p.ObservePrepare(20*time.Millisecond, nil)
	p.ObservePrepare(2*time.Second, errors.New("refused"))
	p.ObserveUnprepare(5*time.Millisecond, nil)
	p.SlicePublishError()
	p.HealthEvent("xid", false)
	p.HealthEvent("xid", true)
	p.HealthEvent("xid", true)
	var ready atomic.Bool
	srv := metrics.NewServer(p, "/metrics", func() error {
		if !ready.Load() {
			return errors.New("the devices are not published yet")
		}
		return nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	code, body := scrape(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`gpudra_prepare_duration_seconds_count{result="success"} 1`,
		`gpudra_prepare_duration_seconds_count{result="error"} 1`,
		`gpudra_prepare_duration_seconds_bucket{result="error",le="2.5"} 1`,
		`gpudra_unprepare_duration_seconds_count{result="success"} 1`,
		`gpudra_resourceslice_publish_errors_total 1`,
		`gpudra_prepared_claims 3`,
		`gpudra_published_devices{type="gpu"} 8`,
		`gpudra_published_devices{type="mig"} 40`,
		`gpudra_mps_daemons 2`,
		`gpudra_health_events_total{event="xid",ignored="false"} 1`,
		`gpudra_health_events_total{event="xid",ignored="true"} 2`,
		`gpudra_tainted_devices{effect="NoExecute"} 9`,
		`gpudra_tainted_devices{effect="NoSchedule"} 0`,
		`gpudra_checkpoint_writes_total{result="success"} 7`,
		`gpudra_checkpoint_writes_total{result="error"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}

	state.PreparedClaims = -1 // the checkpoint cannot be read: no gauge rather than a wrong one
	if _, body := scrape(t, base+"/metrics"); strings.Contains(body, "gpudra_prepared_claims ") {
		t.Error("prepared_claims reported while the checkpoint cannot be read")
	}

	for _, path := range []string{metrics.LivezPath, metrics.HealthPath} {
		if code, _ := scrape(t, base+path); code != http.StatusOK {
			t.Errorf("%s: %d", path, code)
		}
	}
	if code, body := scrape(t, base+metrics.ReadyzPath); code != http.StatusServiceUnavailable || !strings.Contains(body, "not published yet") {
		t.Errorf("/readyz before ready: %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := scrape(t, base+metrics.ReadyzPath); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after shutdown: %v", err)
	}
}
