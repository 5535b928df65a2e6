package draplugin_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
)

// Corrupt or foreign state found at plugin start (issue "Prove the
// crash-safety claims at scale"): each is handled without a crash loop
// (the plugin starts, registers and serves, and starts again), with an
// event or a log line that says what was done.

// logs returns what the running plugin logged so far.
func (h *harness) logs() string {
	h.tb.Helper()
	u, ok := klog.FromContext(h.ctx).GetSink().(ktesting.Underlier)
	if !ok {
		h.tb.Fatal("the harness does not log to a test logger")
	}
	return u.GetBuffer().String()
}

// serves checks that the plugin registered with the kubelet and serves DRA
// gRPC: a prepare of a free GPU and its unprepare work.
func (h *harness) serves(device string) {
	h.tb.Helper()
	t, ok := h.tb.(*testing.T)
	if !ok {
		h.tb.Fatal("serves needs a *testing.T")
	}
	if info := getInfo(t, filepath.Join(h.cfg.RegistrarDir, driverName+"-reg.sock")); info.Endpoint != h.draSocket() {
		t.Errorf("registered endpoint %s, want %s", info.Endpoint, h.draSocket())
	}
	claim := h.claim(device)
	h.mustPrepare(claim)
	h.mustUnprepare(claim)
}

func movedAsideCheckpoints(t *testing.T, h *harness) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json.corrupt-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestStartWithDamagedCheckpoint: an unreadable checkpoint, whatever the
// damage, is moved aside with a CheckpointUnreadable event naming where it
// went; the claims whose specs are on the node are adopted (the prepared
// claim keeps its GPU and its CDI devices); the plugin serves, and starts
// again without finding anything new to move aside.
// (TestCorruptCheckpointAdoptsPreparedClaims follows one such start
// through sweeps and restarts.)
func TestStartWithDamagedCheckpoint(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, path string){
		"truncated mid-record": func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			writeBytes(t, path, data[:len(data)*2/3])
		},
		"garbage":        func(t *testing.T, path string) { writeBytes(t, path, []byte("\x00\xff\xfe garbage \x1b[2J")) },
		"empty":          func(t *testing.T, path string) { writeBytes(t, path, nil) },
		"JSON of a list": func(t *testing.T, path string) { writeBytes(t, path, []byte(`[{"version":"v5"}]`)) },
		// A development schema, never released: a version the plugin
		// does not read, however readable the rest.
		"schema v4": func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			v4 := bytes.Replace(data, []byte(`{"version":"v2",`), []byte(`{"version":"v4",`), 1)
			if bytes.Equal(v4, data) {
				t.Fatalf("checkpoint not in v2: %s", data)
			}
			writeBytes(t, path, v4)
		},
		"a directory": func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(path, "inside"), 0o755); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := shorttemp.Dir(t)
			h := newHarnessIn(t, dir)
			held := h.claim("gpu-1")
			want := h.mustPrepare(held)
			h.stop()
			damage(t, filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"))
			client := h.client

			claims := h.claimNo.Load()
			h = newHarnessIn(t, dir, func(cfg *draplugin.Config) { cfg.KubeClient = client })
			h.claimNo.Store(claims) // the API server has those claims already
			aside := movedAsideCheckpoints(t, h)
			if len(aside) != 1 {
				t.Fatalf("damaged checkpoint not moved aside: %v", aside)
			}
			events, err := h.waitForEvent("CheckpointUnreadable")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(events, aside[0]) {
				t.Errorf("event does not say where the checkpoint went: %s", events)
			}
			if !strings.Contains(h.checkpoint(), string(held.UID)) || !strings.Contains(h.checkpoint(), `"adopted":true`) {
				t.Errorf("the prepared claim was not adopted: %s", h.checkpoint())
			}
			if msg := prepareError(h, h.claim("gpu-1")); !strings.Contains(msg, "already prepared") {
				t.Errorf("a second claim for the adopted claim's GPU: %q, want a conflict", msg)
			}
			if got := h.mustPrepare(held); !slices.Equal(got.Devices[0].CdiDeviceIds, want.Devices[0].CdiDeviceIds) {
				t.Errorf("the kubelet's prepare of the adopted claim answered %v, before the damage %v", got.Devices, want.Devices)
			}
			h.serves("gpu-2")

			h.restart()
			if again := movedAsideCheckpoints(t, h); len(again) != 1 {
				t.Errorf("the restart moved more aside: %v", again)
			}
			h.mustUnprepare(held)
			h.serves("gpu-1")
		})
	}
}

func writeBytes(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStartWithNewerCheckpoint: a checkpoint of a newer schema version is
// left exactly as it is, at every start, with a CheckpointTooNew event;
// the plugin registers and refuses to prepare, naming the version, rather
// than exit. (TestNewerCheckpointKeepsMIGGPUsPublished checks what it
// publishes meanwhile.)
func TestStartWithNewerCheckpoint(t *testing.T) {
	dir := shorttemp.Dir(t)
	h := newHarnessIn(t, dir)
	h.stop()
	content := []byte(`{"version":"v6","bootID":"boot-1","claims":{"x":{"uid":"x","phase":"PrepareCommitted","devices":[{"pool":"dgx-h100-0","name":"gpu-0"}]}},"whatever":[1,2]}` + "\n")
	path := filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")
	writeBytes(t, path, content)
	for range 2 {
		h.start()
		if _, err := h.waitForEvent("CheckpointTooNew"); err != nil {
			t.Error(err)
		}
		getInfo(t, filepath.Join(h.cfg.RegistrarDir, driverName+"-reg.sock"))
		if msg := prepareError(h, h.claim("gpu-3")); !strings.Contains(msg, `"v6"`) {
			t.Errorf("prepare with a newer checkpoint: %q, want it refused naming the version", msg)
		}
		if data, err := os.ReadFile(path); err != nil || !bytes.Equal(data, content) {
			t.Errorf("the newer checkpoint was changed (%v):\n%s", err, data)
		}
		if aside := movedAsideCheckpoints(t, h); len(aside) != 0 {
			t.Errorf("the newer checkpoint was moved aside: %v", aside)
		}
		h.stop()
	}
}

// exampleCheckpoint is a committed example checkpoint of pkg/checkpoint,
// moved to this test's node and boot.
func exampleCheckpoint(t *testing.T, version string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", version+".json"))
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.ReplaceAll(data, []byte("3ee9bf4e-2bc3-4adb-a604-5bd7215f0766"), []byte("boot-1"))
	return bytes.ReplaceAll(data, []byte(`"node-1"`), []byte(`"`+nodeName+`"`))
}

// TestStartWithEachSchema: a checkpoint of each schema version this plugin
// reads, v2 and v5 (the committed examples, moved to this node and boot),
// is read without a migration and stays in a version this plugin writes,
// keeping every claim: their GPUs stay held, and a claim without records
// is unprepared as usual. (TestStartWithDamagedCheckpoint covers a
// version it does not read.)
func TestStartWithEachSchema(t *testing.T) {
	for _, tc := range []struct {
		version string
		// held is a full GPU a claim of the file holds; free is a claim
		// without records to unprepare, which frees held.
		held, free string
	}{
		{"v2", "gpu-4", "d4c3b2a1-0f9e-4d8c-b7a6-958473625140"},
		{"v5", "gpu-0", "33333333-cccc-4ccc-8ccc-000000000003"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			dir := shorttemp.Dir(t)
			old := exampleCheckpoint(t, tc.version)
			if err := os.MkdirAll(filepath.Join(dir, "plugin"), 0o755); err != nil {
				t.Fatal(err)
			}
			writeBytes(t, filepath.Join(dir, "plugin", "checkpoint.json"), old)
			h := newHarnessIn(t, dir)

			if loggedLine(h.logs(), "Checkpoint migrated") {
				t.Errorf("a %s checkpoint was migrated", tc.version)
			}
			now := h.checkpoint()
			var head struct{ Version, BootID string }
			if err := json.Unmarshal([]byte(now), &head); err != nil || (head.Version != "v2" && head.Version != "v5") || head.BootID != "boot-1" {
				t.Errorf("checkpoint not in a version this plugin writes (%v):\n%s", err, now)
			}
			for _, uid := range claimUIDsOf(t, old) {
				if !strings.Contains(now, `"`+uid+`"`) {
					t.Errorf("claim %s of the %s file was lost:\n%s", uid, tc.version, now)
				}
			}
			if len(movedAsideCheckpoints(t, h)) != 0 {
				t.Error("a readable checkpoint was moved aside")
			}
			rival := h.claimFor("rival", "rival-uid", tc.held)
			if msg := prepareError(h, rival); !strings.Contains(msg, "already prepared") {
				t.Errorf("a new claim for %s, held in the %s file: %q, want a conflict", tc.held, tc.version, msg)
			}
			h.serves("gpu-7")
			h.restart()
			freed := h.claimFor("from-"+tc.version, types.UID(tc.free))
			h.mustUnprepare(freed)
			if strings.Contains(h.checkpoint(), tc.free) {
				t.Errorf("unprepared claim %s still recorded", tc.free)
			}
			h.mustPrepare(rival)
		})
	}
}

// claimUIDsOf lists the claims of a checkpoint file.
func claimUIDsOf(t *testing.T, data []byte) []string {
	t.Helper()
	var f struct {
		Claims map[string]json.RawMessage `json:"claims"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	uids := slices.Collect(maps.Keys(f.Claims))
	if len(uids) == 0 {
		t.Fatal("example checkpoint without claims")
	}
	return uids
}

// loggedLine reports whether one line of logs holds every part.
func loggedLine(logs string, parts ...string) bool {
	for _, line := range strings.Split(logs, "\n") {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

// TestStartWithoutCDIDirectory: a CDI directory that does not exist (a
// fresh tmpfs) is created at start; one removed while the plugin runs is
// created again by the next prepare.
func TestStartWithoutCDIDirectory(t *testing.T) {
	dir := shorttemp.Dir(t)
	cdiDir := filepath.Join(dir, "run", "cdi")
	h := newHarnessIn(t, dir, func(cfg *draplugin.Config) { cfg.CDIDir = cdiDir })
	if fi, err := os.Stat(cdiDir); err != nil || !fi.IsDir() {
		t.Fatalf("CDI directory not created at start: %v", err)
	}
	h.serves("gpu-0")

	if err := os.RemoveAll(cdiDir); err != nil {
		t.Fatal(err)
	}
	claim := h.claim("gpu-1")
	resp := h.mustPrepare(claim)
	ociEdits(t, cdiDir, resp.Devices[0].CdiDeviceIds)
	h.mustUnprepare(claim)
}

// foreignSpecs are what other vendors keep in the CDI directory: a static
// spec, another DRA driver's claim spec, and the CDI library's temp file
// of another kind, by file name.
var foreignSpecs = map[string]string{
	"nvidia.com-gpu.yaml": "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n",
	"k8s.compute-domain.nvidia.com-claim_00000000-0000-0000-0000-000000000001.json": `{"cdiVersion":"0.5.0","kind":"k8s.compute-domain.nvidia.com/claim","devices":[{"name":"00000000-0000-0000-0000-000000000001-channel","containerEdits":{"env":["A=b"]}}]}`,
	"spec.4242.tmp": `{"cdiVersion":"0.5.0","kind":"k8s.compute-domain.nvidia.com/claim","devices":[]}`,
}

// TestForeignCDISpecsLeftAlone: specs of other vendors in the CDI
// directory, even old ones and one of a claim UID this node's claims use,
// are never adopted, removed or rewritten: not at the first start (no
// checkpoint, so the node's specs are adopted), not after a damaged
// checkpoint, not by the sweep.
func TestForeignCDISpecsLeftAlone(t *testing.T) {
	dir := shorttemp.Dir(t)
	cdiDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for name, content := range foreignSpecs {
		path := filepath.Join(cdiDir, name)
		writeBytes(t, path, []byte(content))
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	adopted := false // our own claim of the foreign spec's UID is adopted
	check := func(h *harness, when string) {
		t.Helper()
		for name, content := range foreignSpecs {
			path := filepath.Join(cdiDir, name)
			data, err := os.ReadFile(path)
			if err != nil || string(data) != content {
				t.Errorf("%s: foreign spec %s changed or removed: %v", when, name, err)
				continue
			}
			if fi, err := os.Stat(path); err != nil || !fi.ModTime().Equal(old) {
				t.Errorf("%s: foreign spec %s rewritten", when, name)
			}
		}
		if adopted {
			// Our claim of the same UID is, with its own device only.
			if !strings.Contains(h.checkpoint(), `"adopted":true`) || strings.Contains(h.checkpoint(), "channel") {
				t.Errorf("%s: our claim not adopted, or with the foreign spec's device: %s", when, h.checkpoint())
			}
		} else if strings.Contains(h.checkpoint(), "00000000-0000-0000-0000-000000000001") {
			t.Errorf("%s: a foreign spec's claim was adopted: %s", when, h.checkpoint())
		}
	}

	h := newHarnessIn(t, dir) // no checkpoint yet: the node's specs are adopted
	check(h, "first start")
	h.driver.Sweep(h.ctx)
	check(h, "sweep")
	claim := h.claim("gpu-0") // uses the UID of the other driver's claim spec
	h.mustPrepare(claim)
	h.stop()
	writeBytes(t, filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"), []byte("garbage"))
	h.start()
	adopted = true
	check(h, "start after a damaged checkpoint")
	adopted = false
	h.mustUnprepare(claim)
	h.driver.Sweep(h.ctx)
	check(h, "unprepare and sweep")
}

// TestStartWithDamagedSpecsOfOurs: files in the CDI directory named like
// this driver's claim specs whose content is no spec (YAML null, garbage),
// or whose name holds no claim UID, do not stop adoption at start: the
// plugin starts and serves. A spec carrying a record this plugin does not
// know (a newer plugin's feature, which this one could not undo) cannot be
// adopted: the plugin starts anyway, says so in a ClaimAdoptionFailed
// event, and refuses every prepare naming the record, as it does for a
// checkpoint holding such a record; the spec stays.
func TestStartWithDamagedSpecsOfOurs(t *testing.T) {
	const ours = "k8s.gpu.nvidia.com-claim_00000000-0000-0000-0000-0000000000aa.json"
	for name, tc := range map[string]struct {
		file, content string
		refusal       string // "" when the plugin serves
	}{
		"YAML null":    {file: ours, content: "null"},
		"garbage":      {file: ours, content: "\x00garbage"},
		"no claim UID": {file: "k8s.gpu.nvidia.com-claim_.json", content: `{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"gpu-6","containerEdits":{"env":["A=b"]}}]}`},
		"unknown record": {
			file:    ours,
			content: `{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","annotations":{"gpudra.io/records":"{\"computeDomainChannel\":{}}"},"devices":[{"name":"00000000-0000-0000-0000-0000000000aa-gpu-6","containerEdits":{"env":["A=b"]}}]}`,
			refusal: "computeDomainChannel",
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := shorttemp.Dir(t)
			path := filepath.Join(dir, "cdi", tc.file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			writeBytes(t, path, []byte(tc.content))
			h := newHarnessIn(t, dir) // no checkpoint: the specs are adopted
			for range 2 {
				if tc.refusal == "" {
					h.serves("gpu-0")
				} else {
					getInfo(t, filepath.Join(h.cfg.RegistrarDir, driverName+"-reg.sock"))
					if events, err := h.waitForEvent("ClaimAdoptionFailed"); err != nil || !strings.Contains(events, tc.refusal) {
						t.Errorf("ClaimAdoptionFailed event %q (%v), want it to name %s", events, err, tc.refusal)
					}
					if msg := prepareError(h, h.claim("gpu-0")); !strings.Contains(msg, tc.refusal) {
						t.Errorf("prepare = %q, want a refusal naming %s", msg, tc.refusal)
					}
					if data, err := os.ReadFile(path); err != nil || string(data) != tc.content {
						t.Errorf("the spec that cannot be adopted was changed or removed: %v", err)
					}
				}
				h.restart()
			}
		})
	}
}

// TestStaleSocketsAtStart: socket files a killed plugin left in its data
// directory and in the kubelet's registration directory, and a plain file
// where a socket goes, do not keep the plugin from registering and
// serving.
func TestStaleSocketsAtStart(t *testing.T) {
	for name, leave := range map[string]func(t *testing.T, path string){
		"stale socket": staleSocket,
		"plain file":   func(t *testing.T, path string) { writeBytes(t, path, []byte("not a socket")) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := shorttemp.Dir(t)
			for _, p := range []string{filepath.Join(dir, "plugin", "dra.sock"), filepath.Join(dir, "registry", driverName+"-reg.sock")} {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				leave(t, p)
			}
			h := newHarnessIn(t, dir)
			h.serves("gpu-0")
		})
	}
}

// staleSocket leaves a unix socket file that nobody listens on, as a
// process killed while serving leaves it.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no stale socket at %s: %v", path, err)
	}
}
