package footprint

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/internal/shorttemp"
)

var (
	binary  = flag.String("footprint.binary", "", "the plugin binary to measure (default: build ./cmd/gpudra-node as make image does)")
	command = flag.String("footprint.command", "kubelet-plugin", "its subcommand")
	cycles  = flag.Int("footprint.cycles", 300, "Prepare/Unprepare cycles per run")
)

// BenchmarkKubeletPluginProcess starts the kubelet plugin process once
// per iteration and reports its start-to-socket time and its memory once
// it has published and after the cycles (make bench-rss runs it):
//
//	go test -run '^$' -bench KubeletPluginProcess -benchtime 1x -count 5 ./internal/footprint/ [-footprint.binary=...]
func BenchmarkKubeletPluginProcess(b *testing.B) {
	bin := *binary
	if bin == "" {
		bin = build(b, "./cmd/gpudra-node")
	}
	fi, err := os.Stat(bin)
	if err != nil {
		b.Fatal(err)
	}
	const mib = 1 << 20
	for b.Loop() {
		f, err := Run(context.Background(), Options{Binary: bin, Command: strings.Fields(*command), Dir: shorttemp.Dir(b), Cycles: *cycles})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(f.StartToSocket.Microseconds())/1000, "start-ms")
		b.ReportMetric(float64(f.Started.VmRSS)/mib, "started-VmRSS-MiB")
		b.ReportMetric(float64(f.AfterCycles.VmRSS)/mib, "VmRSS-MiB")
		b.ReportMetric(float64(f.AfterCycles.RssAnon)/mib, "RssAnon-MiB")
		b.ReportMetric(float64(f.AfterCycles.RssFile)/mib, "RssFile-MiB")
		b.ReportMetric(float64(fi.Size())/1e6, "binary-MB")
		b.ReportMetric(float64(f.CPU.Milliseconds()), "cpu-ms")
	}
}

// build builds a command of this module as make image does (stripped,
// with cgo and the Makefile's GO_TAGS) into the benchmark's temporary
// directory.
func build(b *testing.B, pkg string) string {
	b.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		b.Fatalf("go list -m: %v", err)
	}
	out := filepath.Join(b.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = strings.TrimSpace(string(root))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if os.Getenv("CGO_CFLAGS") == "" {
		// go-nvml's header marks calls deprecated that the bindings wrap.
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", pkg, err, msg)
	}
	return out
}
