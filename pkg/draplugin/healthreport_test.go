package draplugin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// healthStream is a client of the plugin's DRAResourceHealth stream, as the
// kubelet opens it, with the reports it received.
type healthStream struct {
	t       *testing.T
	reports chan *drahealthv1.NodeWatchResourcesResponse
}

func watchHealth(t *testing.T, h *harness) *healthStream {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+h.draSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatalf("NodeWatchResources: %v", err)
	}
	s := &healthStream{t: t, reports: make(chan *drahealthv1.NodeWatchResourcesResponse, 100)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			s.reports <- r
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close()
	})
	return s
}

// next returns the next report; it fails after within.
func (s *healthStream) next(within time.Duration) *drahealthv1.NodeWatchResourcesResponse {
	s.t.Helper()
	select {
	case r := <-s.reports:
		return r
	case <-time.After(within):
		s.t.Fatalf("no health report within %v", within)
		return nil
	}
}

// drain drops the reports received so far: they may have been built
// before what the test waited for.
func (s *healthStream) drain() {
	for {
		select {
		case <-s.reports:
		default:
			return
		}
	}
}

// waitFor reads reports until one satisfies cond, and returns it and how
// long that took.
func (s *healthStream) waitFor(what string, cond func(map[string]*drahealthv1.DeviceHealth) bool) (map[string]*drahealthv1.DeviceHealth, time.Duration) {
	s.t.Helper()
	start := time.Now()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case r := <-s.reports:
			if byName := byDevice(r); cond(byName) {
				return byName, time.Since(start)
			}
		case <-deadline:
			s.t.Fatalf("%s: no such health report within 5 s", what)
		}
	}
}

func byDevice(r *drahealthv1.NodeWatchResourcesResponse) map[string]*drahealthv1.DeviceHealth {
	out := map[string]*drahealthv1.DeviceHealth{}
	for _, d := range r.GetDevices() {
		out[d.GetDevice().GetDeviceName()] = d
	}
	return out
}

// unhealthy names the devices a report calls anything but healthy.
func unhealthy(byName map[string]*drahealthv1.DeviceHealth) map[string]string {
	out := map[string]string{}
	for name, d := range byName {
		if d.GetHealth() != drahealthv1.HealthStatus_HEALTHY {
			out[name] = d.GetHealth().String() + ": " + d.GetMessage()
		}
	}
	return out
}

// TestHealthStream: the kubelet's health stream gets every published
// device healthy at once, with the pool, a lease and a fresh timestamp; a
// fatal XID makes the GPU's device Unhealthy (and no other), an
// application XID changes nothing, recovery makes it Healthy again, and
// the report is resent within the interval while nothing changes.
func TestHealthStream(t *testing.T) {
	const interval = 300 * time.Millisecond
	h := newHealthHarness(t, "dgx-h100", nodeName, 8, func(cfg *draplugin.Config) { cfg.HealthReportInterval = interval })
	s := watchHealth(t, h.harness)

	first := byDevice(s.next(5 * time.Second))
	if len(first) != len(h.driver.Devices()) || len(first) != 8 {
		t.Fatalf("first report has %d devices, the plugin publishes %d", len(first), len(h.driver.Devices()))
	}
	if bad := unhealthy(first); len(bad) != 0 {
		t.Errorf("first report: %v, want all healthy", bad)
	}
	d := first["gpu-3"]
	if d.GetDevice().GetPoolName() != nodeName || d.GetHealthCheckTimeoutSeconds() != int64(draplugin.HealthCheckTimeout/time.Second) ||
		time.Since(time.Unix(d.GetLastUpdatedTime(), 0)) > 2*time.Second {
		t.Errorf("gpu-3: pool %q, timeout %ds, last updated %v", d.GetDevice().GetPoolName(), d.GetHealthCheckTimeoutSeconds(), time.Unix(d.GetLastUpdatedTime(), 0))
	}

	// Resent while nothing changes, within the interval (and some slack
	// for a busy machine).
	start := time.Now()
	again := byDevice(s.next(interval + 2*time.Second))
	t.Logf("report resent after %v (interval %v)", time.Since(start), interval)
	if len(again) != 8 || len(unhealthy(again)) != 0 {
		t.Errorf("resent report: %d devices, unhealthy %v", len(again), unhealthy(again))
	}

	h.do(3, "xid:79")
	got, took := s.waitFor("gpu-3 unhealthy", func(m map[string]*drahealthv1.DeviceHealth) bool {
		return m["gpu-3"].GetHealth() == drahealthv1.HealthStatus_UNHEALTHY
	})
	t.Logf("fatal XID injected -> Unhealthy on the health stream: %v", took)
	if bad := unhealthy(got); len(bad) != 1 || !strings.Contains(bad["gpu-3"], "xid 79") {
		t.Errorf("after xid 79 on GPU 3: %v, want gpu-3 only, naming xid 79", bad)
	}

	h.do(4, "xid:13")
	for range 3 { // several rounds: an application XID changes no report
		if bad := unhealthy(byDevice(s.next(interval + 2*time.Second))); len(bad) != 1 || bad["gpu-3"] == "" {
			t.Errorf("after an application XID on GPU 4: %v, want gpu-3 only", bad)
		}
	}

	h.do(3, "recover")
	_, took = s.waitFor("gpu-3 healthy again", func(m map[string]*drahealthv1.DeviceHealth) bool { return len(unhealthy(m)) == 0 })
	t.Logf("recovery injected -> Healthy on the health stream: %v", took)

	h.do(5, "gpu-lost")
	got, _ = s.waitFor("gpu-5 lost", func(m map[string]*drahealthv1.DeviceHealth) bool {
		return m["gpu-5"].GetHealth() == drahealthv1.HealthStatus_UNHEALTHY
	})
	if bad := unhealthy(got); len(bad) != 1 || !strings.Contains(bad["gpu-5"], "gpu-lost") {
		t.Errorf("after GPU 5 was lost: %v, want gpu-5 only, naming gpu-lost", bad)
	}
}

// brokenHealth is hardware whose health watcher cannot run (as without
// NVML's event support): every watch fails at once.
type brokenHealth struct{ hardware.Hardware }

func (brokenHealth) WatchHealth(context.Context, chan<- hardware.HealthEvent) error {
	return errors.New("simulated: NVML event sets unavailable")
}

// TestHealthStreamUnknown: while the health watcher cannot run, the
// kubelet hears every device's health as Unknown, saying why, rather than
// a Healthy nobody checked.
func TestHealthStreamUnknown(t *testing.T) {
	h := newHarness(t, func(cfg *draplugin.Config) { cfg.Hardware = brokenHealth{cfg.Hardware} })
	s := watchHealth(t, h)
	got, _ := s.waitFor("every device Unknown", func(m map[string]*drahealthv1.DeviceHealth) bool {
		for _, d := range m {
			if d.GetHealth() != drahealthv1.HealthStatus_UNKNOWN {
				return false
			}
		}
		return len(m) == len(h.driver.Devices())
	})
	if msg := got["gpu-0"].GetMessage(); !strings.Contains(msg, "not watched") {
		t.Errorf("gpu-0: message %q does not say why its health is unknown", msg)
	}
}
