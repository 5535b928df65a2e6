package cutproxy

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// TestProxyCuts: a refused API server refuses connections, a partitioned
// one swallows requests; both work again once restored, on the same
// address.
func TestProxyCuts(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer backend.Close()
	p, err := Start(backend.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	get := func() error {
		resp, err := client.Get("http://" + p.Addr())
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err == nil && string(body) != "ok" {
			err = errors.New("unexpected body " + string(body))
		}
		return err
	}
	if err := get(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Cut(Refuse)
	if err := get(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("refused: %v, want connection refused", err)
	}
	p.Restore()
	if err := get(); err != nil {
		t.Errorf("after a refusal: %v", err)
	}
	p.Cut(Blackhole)
	start := time.Now()
	if err := get(); err == nil || time.Since(start) < 250*time.Millisecond {
		t.Errorf("partitioned: %v after %v, want the client's timeout", err, time.Since(start))
	}
	p.Restore()
	if err := get(); err != nil {
		t.Errorf("after a partition: %v", err)
	}
}
