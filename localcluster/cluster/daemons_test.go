package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestMain(m *testing.M) {
	if code, ok := Main(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

const (
	plainFleet  = "nodes:\n- name: n0\n  gpus: [{model: H100-SXM5-80GB}]\n"
	cliqueFleet = "nodes:\n- name: nvl-0\n  fabric: {cliqueID: 1}\n  gpus: [{model: GB200}]\n"
)

// TestSetUpDaemons: Start installs the fake MPS control binary unless the
// options name one or ask for no daemons, and the fake IMEX daemon where
// the ComputeDomain driver runs; Stop's removal leaves neither.
func TestSetUpDaemons(t *testing.T) {
	enabled := func(on bool) map[string]any {
		return map[string]any{"computeDomains": map[string]any{"enabled": on}}
	}
	for _, tc := range []struct {
		name              string
		fleet             string
		opts              Options
		wantMPS, wantIMEX string // "fake", "" or the path given
	}{
		{name: "no clique", fleet: plainFleet, wantMPS: "fake"},
		{name: "clique", fleet: cliqueFleet, wantMPS: "fake", wantIMEX: "fake"},
		{name: "compute domains asked for", fleet: plainFleet, opts: Options{ComputeDomains: true}, wantMPS: "fake", wantIMEX: "fake"},
		{name: "compute domains enabled by the values", fleet: plainFleet, opts: Options{ChartValues: enabled(true)}, wantMPS: "fake", wantIMEX: "fake"},
		{name: "compute domains disabled by the values", fleet: cliqueFleet, opts: Options{ChartValues: enabled(false)}, wantMPS: "fake"},
		{name: "no daemons", fleet: cliqueFleet, opts: Options{NoDaemons: true}},
		{name: "own binaries", fleet: cliqueFleet, opts: Options{MPSControlBinary: "/opt/mps-control", IMEXBinary: "/opt/imex"},
			wantMPS: "/opt/mps-control", wantIMEX: "/opt/imex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fleet, err := simfleet.Parse([]byte(tc.fleet), tc.name)
			if err != nil {
				t.Fatal(err)
			}
			c := &Cluster{opts: tc.opts}
			c.opts.Fleet = fleet
			if err := c.setUpDaemons(); err != nil {
				t.Fatal(err)
			}
			check := func(what, got, want string) string {
				t.Helper()
				switch want {
				case "":
					if got != "" {
						t.Errorf("%s %q, want none", what, got)
					}
				case "fake":
					if _, err := os.Stat(got); got == "" || err != nil {
						t.Errorf("%s %q, want an installed fake: %v", what, got, err)
					}
					return filepath.Dir(got)
				default:
					if got != want {
						t.Errorf("%s %q, want %q", what, got, want)
					}
				}
				return ""
			}
			dirs := []string{
				check("MPS control binary", c.opts.MPSControlBinary, tc.wantMPS),
				check("IMEX binary", c.opts.IMEXBinary, tc.wantIMEX),
			}
			c.removeDaemons()
			for _, dir := range dirs {
				if _, err := os.Stat(dir); dir != "" && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left after the removal: %v", dir, err)
				}
			}
		})
	}
}

// TestStartRefusesFakesWithoutMain: a program that did not call Main
// would run as itself when a node starts a fake daemon; Start says so
// before it starts anything.
func TestStartRefusesFakesWithoutMain(t *testing.T) {
	canRunFakes.Store(false)
	t.Cleanup(func() { canRunFakes.Store(true) })
	fleet, err := simfleet.Parse([]byte(plainFleet), "plain")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, err = Start(context.Background(), Options{Fleet: fleet, Dir: dir})
	if !errors.Is(err, errNoMain) {
		t.Fatalf("Start without Main: %v, want %v", err, errNoMain)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("Start left %d entries in its directory", len(entries))
	}
}
