package cdi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
)

func newWriter(t *testing.T, dir string) *cdi.Writer {
	t.Helper()
	w, err := cdi.NewWriter(dir, driver)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w
}

func buildSpec(t *testing.T, n node, uid string, common *cdispec.ContainerEdits, names ...string) *cdispec.Spec {
	t.Helper()
	spec, err := cdi.BuildSpec(cdi.SpecInput{DriverName: driver, ClaimUID: uid, Majors: n.inv.Majors, Devices: cdi.Whole(n.devices(t, names...)...), Common: common})
	if err != nil {
		t.Fatalf("BuildSpec: %v", err)
	}
	return spec
}

// resolve does what a container runtime does with the device IDs the
// kubelet passes on: read the spec directory with the CDI library and
// apply the devices' edits to an empty OCI spec.
func resolve(t *testing.T, dir string, ids ...string) (*rspec.Spec, []string, error) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	for path, errs := range cache.GetErrors() {
		t.Errorf("CDI library rejects %s: %v", path, errs)
	}
	oci := &rspec.Spec{Linux: &rspec.Linux{}, Process: &rspec.Process{}}
	unresolved, err := cache.InjectDevices(oci, ids...)
	return oci, unresolved, err
}

func ociNodes(s *rspec.Spec) []devNode {
	var out []devNode
	for _, d := range s.Linux.Devices {
		out = append(out, devNode{d.Path, d.Type, d.Major, d.Minor})
	}
	return out
}

// TestWrittenSpecsResolve is the contract with the container runtime: the
// IDs handed to the kubelet resolve, through the CDI library, to the
// device nodes with the right type, major and minor, without the nodes
// existing on this machine.
func TestWrittenSpecsResolve(t *testing.T) {
	n := loadNode(t)
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Log("/dev/nvidia0 exists here; the CDI library may add file modes, majors and minors must still be the spec's")
	}
	tests := []struct {
		name    string
		devices []string
		common  *cdispec.ContainerEdits
		// wantEnv is the container's environment.
		wantEnv []string
	}{
		{name: "full GPU", devices: []string{"gpu-4"}, wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
		{name: "MIG device", devices: []string{"gpu-1-mig-3g20gb-9-4"}, wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
		{name: "two MIG devices of one GPU", devices: []string{"gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-3"}, wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
		{
			name:    "full GPUs, MIG devices and driver edits",
			devices: []string{"gpu-5", "gpu-1-mig-2g10gb-14-0", "gpu-3-mig-7g40gb-0-0", "gpu-6"},
			common: &cdispec.ContainerEdits{
				Env:         []string{"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"},
				DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia-modeset", Type: "c", Major: 195, Minor: 254}},
			},
			wantEnv: []string{"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu", "NVIDIA_VISIBLE_DEVICES=void"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			w := newWriter(t, dir)
			if err := w.Write(claimUID, buildSpec(t, n, claimUID, tt.common, tt.devices...)); err != nil {
				t.Fatalf("Write: %v", err)
			}
			if want := filepath.Join(dir, "k8s.gpu.nvidia.com-claim_"+claimUID+".json"); w.Path(claimUID) != want {
				t.Errorf("Path = %s, want %s", w.Path(claimUID), want)
			}
			if _, err := os.Stat(w.Path(claimUID)); err != nil {
				t.Fatalf("spec file: %v", err)
			}

			var ids []string
			want := map[string]devNode{}
			for _, d := range controlNodes {
				want[d.path] = d
			}
			if tt.common != nil {
				for _, d := range nodesOf(tt.common.DeviceNodes) {
					want[d.path] = d
				}
			}
			for _, d := range n.devices(t, tt.devices...) {
				ids = append(ids, cdi.DeviceID(driver, claimUID, d.Name()))
				for _, node := range wantNodes(d) {
					want[node.path] = node
				}
			}
			oci, unresolved, err := resolve(t, dir, ids...)
			if err != nil || len(unresolved) != 0 {
				t.Fatalf("InjectDevices(%q) = %q, %v", ids, unresolved, err)
			}

			got := ociNodes(oci)
			seen := map[string]bool{}
			for _, g := range got {
				if seen[g.path] {
					t.Errorf("device node %s appears twice", g.path)
				}
				seen[g.path] = true
				if w, ok := want[g.path]; !ok || w != g {
					t.Errorf("device node %v, want %v", g, w)
				}
			}
			for path, w := range want {
				if !seen[path] {
					t.Errorf("device node %v missing", w)
				}
			}
			// The device cgroup allows each node, read-write-mknod.
			allowed := map[string]bool{}
			for _, r := range oci.Linux.Resources.Devices {
				if r.Allow && r.Major != nil && r.Minor != nil {
					allowed[fmt.Sprintf("%s %d:%d %s", r.Type, *r.Major, *r.Minor, r.Access)] = true
				}
			}
			for _, w := range want {
				if rule := fmt.Sprintf("c %d:%d rwm", w.major, w.minor); !allowed[rule] {
					t.Errorf("no device cgroup rule %q for %s (rules: %v)", rule, w.path, allowed)
				}
			}
			if !slices.Equal(oci.Process.Env, tt.wantEnv) {
				t.Errorf("env %q, want %q", oci.Process.Env, tt.wantEnv)
			}
		})
	}
}

func TestWriteReplacesAndIsolatesClaims(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)
	const other = "0a9f1c2e-0000-4000-8000-000000000001"

	if err := w.Write(claimUID, buildSpec(t, n, claimUID, nil, "gpu-4")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(other, buildSpec(t, n, other, nil, "gpu-5")); err != nil {
		t.Fatal(err)
	}
	// A second Write of a claim replaces its spec.
	if err := w.Write(claimUID, buildSpec(t, n, claimUID, nil, "gpu-6")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id         string
		unresolved bool
		want       string // the GPU node it brings
	}{
		{cdi.DeviceID(driver, claimUID, "gpu-6"), false, "/dev/nvidia6"},
		{cdi.DeviceID(driver, claimUID, "gpu-4"), true, ""},
		{cdi.DeviceID(driver, other, "gpu-5"), false, "/dev/nvidia5"},
		// A claim's device IDs never resolve to another claim's devices.
		{cdi.DeviceID(driver, other, "gpu-6"), true, ""},
		{cdi.DeviceID("gpu.example.com", claimUID, "gpu-6"), true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			oci, unresolved, err := resolve(t, dir, tt.id)
			if tt.unresolved {
				if err == nil || !slices.Equal(unresolved, []string{tt.id}) {
					t.Errorf("InjectDevices = %q, %v; want %s unresolved", unresolved, err, tt.id)
				}
				return
			}
			if err != nil {
				t.Fatalf("InjectDevices: %v", err)
			}
			var paths []string
			for _, d := range oci.Linux.Devices {
				paths = append(paths, d.Path)
			}
			if !slices.Contains(paths, tt.want) || len(paths) != 4 {
				t.Errorf("device nodes %v, want the control nodes and %s", paths, tt.want)
			}
		})
	}
	uids, err := w.ClaimUIDs()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{other, claimUID}; !slices.Equal(uids, want) {
		t.Errorf("ClaimUIDs = %q, want %q", uids, want)
	}
}

func TestWriteInvalidSpec(t *testing.T) {
	n := loadNode(t)
	tests := []struct {
		name   string
		mutate func(*cdispec.Spec)
	}{
		{"no devices", func(s *cdispec.Spec) { s.Devices = nil }},
		{"device twice", func(s *cdispec.Spec) { s.Devices = append(s.Devices, s.Devices[0]) }},
		{"bad kind", func(s *cdispec.Spec) { s.Kind = "no-class" }},
		{"bad node type", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits.DeviceNodes[0].Type = "x" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			w := newWriter(t, dir)
			spec := buildSpec(t, n, claimUID, nil, "gpu-4")
			tt.mutate(spec)
			err := w.Write(claimUID, spec)
			if err == nil || !strings.Contains(err.Error(), claimUID) {
				t.Fatalf("Write = %v, want an error naming the claim", err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a refused spec left files behind: %v", entries)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)

	// Removing what was never written is fine.
	if err := w.Remove(claimUID); err != nil {
		t.Fatalf("Remove of a missing spec: %v", err)
	}
	if err := w.Write(claimUID, buildSpec(t, n, claimUID, nil, "gpu-4")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := w.Remove(claimUID); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
		if _, err := os.Stat(w.Path(claimUID)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("spec file after Remove: %v", err)
		}
	}
	if _, unresolved, err := resolve(t, dir, cdi.DeviceID(driver, claimUID, "gpu-4")); err == nil || len(unresolved) != 1 {
		t.Errorf("removed claim still resolves: %q, %v", unresolved, err)
	}

	// A failure other than "not there" is reported, naming the claim.
	if err := os.MkdirAll(filepath.Join(w.Path("stuck"), "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove("stuck"); err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Errorf("Remove of an undeletable path = %v, want an error naming the claim", err)
	}
}

func TestClaimUIDs(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)
	otherDriver, err := cdi.NewWriter(dir, "gpu.nvidia.com.example")
	if err != nil {
		t.Fatal(err)
	}
	shortDriver, err := cdi.NewWriter(dir, "nvidia.com")
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"uid-b", "uid-a", "uid-c"} {
		if err := w.Write(uid, buildSpec(t, n, uid, nil, "gpu-4")); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Remove("uid-c"); err != nil {
		t.Fatal(err)
	}
	otherSpec := buildSpec(t, n, "uid-x", nil, "gpu-4")
	otherSpec.Kind = cdi.Kind("gpu.nvidia.com.example")
	if err := otherDriver.Write("uid-x", otherSpec); err != nil {
		t.Fatal(err)
	}
	shortSpec := buildSpec(t, n, "uid-y", nil, "gpu-4")
	shortSpec.Kind = cdi.Kind("nvidia.com")
	if err := shortDriver.Write("uid-y", shortSpec); err != nil {
		t.Fatal(err)
	}
	// Files that are not this driver's claim specs.
	for _, name := range []string{
		"nvidia.com-gpu.yaml",                       // the NVIDIA container toolkit's spec
		"k8s.gpu.nvidia.com-claim.json",             // ours, but not per claim
		"k8s.gpu.nvidia.com-claim_uid-yaml.yaml",    // not what the writer writes
		"k8s.gpu.nvidia.com-claim_uid-tmp.json.tmp", // a temp file
		"k8s.gpu.nvidia.com-claim_.json",            // no claim UID: nothing Write makes
		"spec.1234.tmp",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "k8s.gpu.nvidia.com-claim_uid-dir.json"), 0o755); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		w    *cdi.Writer
		want []string
	}{
		{"this driver", w, []string{"uid-a", "uid-b"}},
		{"a driver whose name extends ours", otherDriver, []string{"uid-x"}},
		{"a driver whose name is a suffix of ours", shortDriver, []string{"uid-y"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.w.ClaimUIDs()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ClaimUIDs = %q, want %q", got, tt.want)
			}
		})
	}

	empty := newWriter(t, t.TempDir())
	if got, err := empty.ClaimUIDs(); err != nil || len(got) != 0 {
		t.Errorf("ClaimUIDs of an empty directory = %q, %v", got, err)
	}
	gone := newWriter(t, filepath.Join(t.TempDir(), "gone"))
	if err := os.RemoveAll(gone.Dir()); err != nil {
		t.Fatal(err)
	}
	if _, err := gone.ClaimUIDs(); err == nil || !strings.Contains(err.Error(), gone.Dir()) {
		t.Errorf("ClaimUIDs of a missing directory: %v, want an error naming it", err)
	}
}

func TestRemoveIfOlder(t *testing.T) {
	n := loadNode(t)
	written := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name        string
		write       bool
		cutoff      time.Time
		wantRemoved bool
	}{
		{"older than the cutoff", true, written.Add(time.Second), true},
		{"written at the cutoff", true, written, false},
		{"newer than the cutoff", true, written.Add(-time.Second), false},
		{"no spec", false, written.Add(time.Hour), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWriter(t, t.TempDir())
			if tt.write {
				if err := w.Write(claimUID, buildSpec(t, n, claimUID, nil, "gpu-4")); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(w.Path(claimUID), written, written); err != nil {
					t.Fatal(err)
				}
			}
			removed, err := w.RemoveIfOlder(claimUID, tt.cutoff)
			if err != nil {
				t.Fatalf("RemoveIfOlder: %v", err)
			}
			if removed != tt.wantRemoved {
				t.Errorf("removed = %v, want %v", removed, tt.wantRemoved)
			}
			_, statErr := os.Stat(w.Path(claimUID))
			if exists := statErr == nil; exists != (tt.write && !tt.wantRemoved) {
				t.Errorf("spec exists = %v after RemoveIfOlder (stat: %v)", exists, statErr)
			}
		})
	}
}

func TestNewWriter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "cdi")
	w := newWriter(t, dir)
	if w.Dir() != dir {
		t.Errorf("Dir = %s, want %s", w.Dir(), dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Errorf("NewWriter did not create %s: %v", dir, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cdi.NewWriter(file, driver); err == nil {
		t.Error("NewWriter on a regular file succeeded")
	}
}

// TestWriterConcurrent runs Write, Remove and ClaimUIDs from several
// goroutines; with -race this checks the "safe for concurrent use" promise.
func TestWriterConcurrent(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)
	names := []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7", "gpu-1-mig-3g20gb-9-4", "gpu-0-mig-1g5gb-19-2"}
	specs := map[string]*cdispec.Spec{}
	for i, name := range names {
		uid := fmt.Sprintf("claim-%d", i)
		specs[uid] = buildSpec(t, n, uid, nil, name)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for uid, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if err := w.Write(uid, spec); err != nil {
					errs <- err
				}
				if _, err := w.ClaimUIDs(); err != nil {
					errs <- err
				}
				if err := w.Remove(uid); err != nil {
					errs <- err
				}
			}
			if err := w.Write(uid, spec); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	uids, err := w.ClaimUIDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(uids) != len(specs) {
		t.Errorf("ClaimUIDs = %q, want the %d claims", uids, len(specs))
	}
	var ids []string
	for i, name := range names {
		ids = append(ids, cdi.DeviceID(driver, fmt.Sprintf("claim-%d", i), name))
	}
	if _, unresolved, err := resolve(t, dir, ids...); err != nil {
		t.Errorf("InjectDevices: %q, %v", unresolved, err)
	}
}

// TestRemoveStaleTemps leaves in one directory what a SIGKILL during a
// spec write leaves (by this version of Write and by earlier ones, which
// wrote through the CDI library) next to other vendors' files, and checks
// that only this driver's temp files go.
func TestRemoveStaleTemps(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)
	const liveUID = "0a9f1c2e-0000-4000-8000-000000000002"
	if err := w.Write(liveUID, buildSpec(t, n, liveUID, nil, "gpu-5")); err != nil {
		t.Fatal(err)
	}
	ourSpec, err := json.Marshal(buildSpec(t, n, claimUID, nil, "gpu-4"))
	if err != nil {
		t.Fatal(err)
	}
	specOfKind := func(kind string) []byte {
		s := buildSpec(t, n, claimUID, nil, "gpu-4")
		s.Kind = kind
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	// createTemp creates a file the way a Write of a version that
	// staged its specs (before 2026-11-28) left it when it was killed:
	// the library's temp file or the finished spec, in the staging
	// directory.
	if err := os.Mkdir(cdi.StagingDir(w), 0o755); err != nil {
		t.Fatal(err)
	}
	createTemp := func(name string, data []byte) string {
		path := filepath.Join(cdi.StagingDir(w), name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			t.Fatal(err)
		}
		return rel
	}

	tests := []struct {
		name        string
		file        string // created with data unless empty
		data        []byte
		wantRemoved bool
	}{
		{"staged temp, killed before writing", createTemp("spec.1.tmp", nil), nil, true},
		{"staged spec, killed before renaming", createTemp(filepath.Base(w.Path(liveUID)), ourSpec), nil, true},
		{"temp of an earlier Write", filepath.Base(w.Path(claimUID)) + ".tmp-42", nil, true},
		{"library temp holding our spec", "spec.1804289383.tmp", ourSpec, true},
		{"library temp, empty", "spec.846930886.tmp", nil, false},
		{"library temp holding another vendor's spec", "spec.1681692777.tmp", specOfKind("nvidia.com/gpu"), false},
		{"library temp holding the spec of a driver whose name extends ours", "spec.1714636915.tmp", specOfKind(cdi.Kind("gpu.nvidia.com.example")), false},
		{"library temp, truncated", "spec.1957747793.tmp", ourSpec[:len(ourSpec)/2], false},
		{"library temp holding YAML", "spec.424238335.tmp", []byte("---\ncdiVersion: 0.5.0\nkind: " + cdi.Kind(driver) + "\n"), false},
		{"another vendor's spec", "nvidia.com-gpu.yaml", specOfKind("nvidia.com/gpu"), false},
		{"another vendor's own temp", "example.com-gpu_1.json.tmp-42", nil, false},
		{"temp of a driver whose name extends ours", "k8s.gpu.nvidia.com.example-claim_" + claimUID + ".json.tmp-42", nil, false},
		{"our live spec", filepath.Base(w.Path(liveUID)), nil, false},
	}
	for _, tt := range tests {
		if _, err := os.Stat(filepath.Join(dir, tt.file)); err == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, tt.file), tt.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A directory is never removed, whatever its name.
	dirLikeTemp := filepath.Join(dir, filepath.Base(w.Path(claimUID))+".tmp-7")
	if err := os.Mkdir(dirLikeTemp, 0o755); err != nil {
		t.Fatal(err)
	}

	removed, err := w.RemoveStaleTemps()
	if err != nil {
		t.Fatalf("RemoveStaleTemps: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.file)
			if got := slices.Contains(removed, path); got != tt.wantRemoved {
				t.Errorf("%s reported removed = %v, want %v (removed: %q)", tt.file, got, tt.wantRemoved, removed)
			}
			_, err := os.Stat(path)
			if exists := err == nil; exists == tt.wantRemoved {
				t.Errorf("%s exists = %v after RemoveStaleTemps, want %v", tt.file, exists, !tt.wantRemoved)
			}
		})
	}
	if fi, err := os.Stat(dirLikeTemp); err != nil || !fi.IsDir() {
		t.Errorf("directory %s removed: %v", dirLikeTemp, err)
	}
	if _, err := os.Stat(cdi.StagingDir(w)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the emptied staging directory is still there: %v", err)
	}
	if want := 4; len(removed) != want {
		t.Errorf("removed %q, want %d files", removed, want)
	}
	// Our live spec still resolves, and a second run finds nothing.
	if _, unresolved, err := resolve(t, dir, cdi.DeviceID(driver, liveUID, "gpu-5")); err != nil {
		t.Errorf("live spec no longer resolves: %q, %v", unresolved, err)
	}
	if again, err := w.RemoveStaleTemps(); err != nil || len(again) != 0 {
		t.Errorf("second RemoveStaleTemps = %q, %v; want nothing", again, err)
	}

	gone := newWriter(t, filepath.Join(t.TempDir(), "gone"))
	if err := os.RemoveAll(gone.Dir()); err != nil {
		t.Fatal(err)
	}
	if _, err := gone.RemoveStaleTemps(); err == nil || !strings.Contains(err.Error(), gone.Dir()) {
		t.Errorf("RemoveStaleTemps of a missing directory: %v, want an error naming it", err)
	}
}

// TestWriteLeavesNoTemps checks that successful and refused writes leave
// only the claim's spec: nothing for RemoveStaleTemps to find, and no file
// named like the CDI library's anonymous temps.
func TestWriteLeavesNoTemps(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)
	if err := w.Write(claimUID, buildSpec(t, n, claimUID, nil, "gpu-4")); err != nil {
		t.Fatal(err)
	}
	bad := buildSpec(t, n, "bad", nil, "gpu-4")
	bad.Devices = nil
	if err := w.Write("bad", bad); err == nil {
		t.Fatal("Write of a spec without devices succeeded")
	}
	// A rename that fails: the target is a non-empty directory.
	if err := os.MkdirAll(filepath.Join(w.Path("stuck"), "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.Write("stuck", buildSpec(t, n, "stuck", nil, "gpu-4")); err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("Write over a directory = %v, want an error naming the claim", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{filepath.Base(w.Path(claimUID)), filepath.Base(w.Path("stuck"))}; !slices.Equal(names, want) {
		t.Errorf("directory holds %q, want %q", names, want)
	}
}

// TestWriteRecreatesDirectory: a spec directory removed under the running
// plugin is created again by the next Write, as NewWriter does at start,
// rather than failing every prepare until a restart.
func TestWriteRecreatesDirectory(t *testing.T) {
	n := loadNode(t)
	w := newWriter(t, filepath.Join(t.TempDir(), "run", "cdi"))
	if err := os.RemoveAll(filepath.Dir(w.Dir())); err != nil {
		t.Fatal(err)
	}
	if err := w.Write("uid-a", buildSpec(t, n, "uid-a", nil, "gpu-4")); err != nil {
		t.Fatalf("Write into a removed directory: %v", err)
	}
	if got, err := w.ClaimUIDs(); err != nil || !slices.Equal(got, []string{"uid-a"}) {
		t.Errorf("ClaimUIDs = %q, %v", got, err)
	}
}
