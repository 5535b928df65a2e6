package cdi

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const testDriverVersion = "580.65.06"

// driverFiles returns edits shaped like nvcdi's common edits for a driver
// of the given version found under root: host paths under root, container
// paths and hook arguments as the workload container names them, the hook
// path as configured.
func driverFiles(root, version string) *cdispec.ContainerEdits {
	under := func(p string) string { return filepath.Join(root, p) }
	node := func(path string, minor int64) *cdispec.DeviceNode {
		n := &cdispec.DeviceNode{Path: path, HostPath: under(path), Major: 195, Minor: minor}
		if n.HostPath == n.Path {
			n.HostPath = "" // as nvcdi writes it
		}
		return n
	}
	mount := func(p string) *cdispec.Mount {
		return &cdispec.Mount{HostPath: under(p), ContainerPath: p, Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}}
	}
	const libs = "/usr/lib/x86_64-linux-gnu"
	return &cdispec.ContainerEdits{
		Env: []string{"NVIDIA_CTK_LIBCUDA_DIR=" + libs, "NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []*cdispec.DeviceNode{
			node("/dev/nvidia-modeset", 254),
			node("/dev/nvidia-uvm-tools", 1),
			node("/dev/nvidia-uvm", 0),
			node("/dev/nvidiactl", 255),
		},
		Mounts: []*cdispec.Mount{
			mount(libs + "/libcuda.so." + version),
			mount(libs + "/libnvidia-ml.so." + version),
			mount("/usr/bin/nvidia-smi"),
			mount("/run/nvidia-persistenced/socket"),
		},
		Hooks: []*cdispec.Hook{
			{HookName: "createContainer", Path: DefaultNVIDIACDIHookPath, Args: []string{"nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so." + version + "::" + libs + "/libcuda.so.1"}},
			{HookName: "createContainer", Path: DefaultNVIDIACDIHookPath, Args: []string{"nvidia-cdi-hook", "update-ldcache", "--folder", libs}},
		},
	}
}

// sharedEdits is what every claim's spec should get from driverFiles
// under root: no NVIDIA_VISIBLE_DEVICES and no control or UVM nodes, which
// BuildSpec adds itself.
func sharedEdits(root, version string) *cdispec.ContainerEdits {
	e := driverFiles(root, version)
	e.Env = e.Env[:1]
	e.DeviceNodes = e.DeviceNodes[:1]
	return e
}

// TestHostEdits: the edits nvcdi finds under the driver root as the plugin
// sees it must be, once translated, the ones nvcdi would have found running
// on the host itself.
func TestHostEdits(t *testing.T) {
	tests := []struct {
		name            string
		container, host string
	}{
		{name: "host-installed driver, plugin on the host", container: "/", host: "/"},
		{name: "driver container mounted at /driver-root", container: "/driver-root", host: "/run/nvidia/driver"},
		{name: "driver container mounted at its host path", container: "/run/nvidia/driver", host: "/run/nvidia/driver"},
		{name: "host root mounted at /host", container: "/host", host: "/"},
		{name: "plugin sees the driver root as /", container: "/", host: "/run/nvidia/driver"},
		{name: "trailing slashes", container: "/driver-root/", host: "/run/nvidia/driver/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := driverFiles(tt.container, testDriverVersion)
			pristine := driverFiles(tt.container, testDriverVersion)
			got := hostEdits(raw, NVCDIOptions{DriverRoot: tt.host, ContainerDriverRoot: tt.container})
			if want := sharedEdits(tt.host, testDriverVersion); !reflect.DeepEqual(got, want) {
				t.Errorf("edits\n got %s\nwant %s", dump(got), dump(want))
			}
			if !reflect.DeepEqual(raw, pristine) {
				t.Errorf("hostEdits changed nvcdi's edits:\n got %s\nwant %s", dump(raw), dump(pristine))
			}
		})
	}
}

// TestHostEditsDriverContainer spells out the DaemonSet case: libraries,
// sockets and device nodes by their host paths, hooks by the host's
// nvidia-cdi-hook, hook arguments as the container names its files.
func TestHostEditsDriverContainer(t *testing.T) {
	got := hostEdits(driverFiles("/driver-root", testDriverVersion), NVCDIOptions{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/driver-root"})
	for i, want := range []string{
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06",
		"/run/nvidia/driver/usr/bin/nvidia-smi",
		"/run/nvidia/driver/run/nvidia-persistenced/socket",
	} {
		if got.Mounts[i].HostPath != want {
			t.Errorf("mount %d: host path %s, want %s", i, got.Mounts[i].HostPath, want)
		}
	}
	if len(got.DeviceNodes) != 1 || got.DeviceNodes[0].HostPath != "/run/nvidia/driver/dev/nvidia-modeset" || got.DeviceNodes[0].Path != "/dev/nvidia-modeset" {
		t.Errorf("device nodes %s, want only /dev/nvidia-modeset from /run/nvidia/driver/dev/nvidia-modeset", dump(got.DeviceNodes))
	}
	if want := []string{"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"}; !reflect.DeepEqual(got.Env, want) {
		t.Errorf("env %q, want %q", got.Env, want)
	}
	wantArgs := [][]string{
		{"nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.580.65.06::/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
		{"nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"},
	}
	for i, h := range got.Hooks {
		if h.Path != DefaultNVIDIACDIHookPath || !reflect.DeepEqual(h.Args, wantArgs[i]) {
			t.Errorf("hook %d: %s %q, want %s %q", i, h.Path, h.Args, DefaultNVIDIACDIHookPath, wantArgs[i])
		}
	}
}

// TestHostEditsHookArguments: hooks that run in the runtime's namespaces
// on the host get host paths in their arguments; hooks that run in the
// container's keep the container's paths. The hook's own path is the
// host's as configured, whatever the roots.
func TestHostEditsHookArguments(t *testing.T) {
	args := []string{"nvidia-cdi-hook", "--root", "/driver-root", "--lib", "/driver-root/usr/lib/libcuda.so", "--link", "/driver-root/lib/a::/driver-root/lib/b", "--other", "/etc/ld.so.conf", "relative/driver-root"}
	hostArgs := []string{"nvidia-cdi-hook", "--root", "/run/nvidia/driver", "--lib", "/run/nvidia/driver/usr/lib/libcuda.so", "--link", "/run/nvidia/driver/lib/a::/run/nvidia/driver/lib/b", "--other", "/etc/ld.so.conf", "relative/driver-root"}
	tests := []struct {
		lifecycle string
		want      []string
	}{
		{"createContainer", args},
		{"startContainer", args},
		{"prestart", hostArgs},
		{"createRuntime", hostArgs},
		{"poststop", hostArgs},
	}
	for _, tt := range tests {
		t.Run(tt.lifecycle, func(t *testing.T) {
			hookPath := "/driver-root/usr/bin/nvidia-cdi-hook" // on the host, under a directory of the same name
			raw := &cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: tt.lifecycle, Path: hookPath, Args: append([]string(nil), args...)}}}
			got := hostEdits(raw, NVCDIOptions{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/driver-root"})
			if h := got.Hooks[0]; h.Path != hookPath || !reflect.DeepEqual(h.Args, tt.want) {
				t.Errorf("hook %s %q\nwant %s %q", h.Path, h.Args, hookPath, tt.want)
			}
			if !reflect.DeepEqual(raw.Hooks[0].Args, args) {
				t.Errorf("nvcdi's hook arguments changed to %q", raw.Hooks[0].Args)
			}
		})
	}
}

func TestRootTranslatorPath(t *testing.T) {
	tr := rootTranslator{container: "/driver-root", host: "/run/nvidia/driver"}
	tests := []struct{ in, want string }{
		{"/driver-root", "/run/nvidia/driver"},
		{"/driver-root/", "/run/nvidia/driver"},
		{"/driver-root/usr/lib/libcuda.so.1", "/run/nvidia/driver/usr/lib/libcuda.so.1"},
		{"/driver-root/../etc/passwd", "/driver-root/../etc/passwd"}, // not under the root once cleaned
		{"/driver-rootfs/usr/lib", "/driver-rootfs/usr/lib"},
		{"/dev/nvidia-modeset", "/dev/nvidia-modeset"},
		{"driver-root/usr", "driver-root/usr"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := tr.path(tt.in); got != tt.want {
			t.Errorf("path(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// fakeNVCDI stands in for nvcdi: it finds the files of the driver version
// installed now under the root it is given, and counts its calls.
type fakeNVCDI struct {
	mu        sync.Mutex
	installed string
	err       error
	calls     int
	opts      []NVCDIOptions
}

func (f *fakeNVCDI) install(version string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.installed = version
}

func (f *fakeNVCDI) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeNVCDI) generate(_ klog.Logger, o NVCDIOptions) (*cdispec.ContainerEdits, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.opts = append(f.opts, o)
	if f.err != nil {
		return nil, f.err
	}
	return driverFiles(o.ContainerDriverRoot, f.installed), nil
}

func (f *fakeNVCDI) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func newFakeEdits(t *testing.T) (*NVCDIEdits, *fakeNVCDI) {
	t.Helper()
	fake := &fakeNVCDI{installed: testDriverVersion}
	e := NewNVCDIEdits(NVCDIOptions{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/driver-root"})
	e.generate = fake.generate
	return e, fake
}

// TestNVCDIEditsPerDriverVersion: the edits are found once per driver
// version, and found again, with the new libraries, when discovery reports
// another version.
func TestNVCDIEditsPerDriverVersion(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	e, fake := newFakeEdits(t)
	steps := []struct {
		name      string
		installed string // the driver version on the node
		reported  string // the version discovery reports
		wantCalls int
		wantLibs  string // version of the libraries in the edits
	}{
		{"first claim", "580.65.06", "580.65.06", 1, "580.65.06"},
		{"second claim", "580.65.06", "580.65.06", 1, "580.65.06"},
		// Before discovery notices the upgrade the old answer stands; the
		// edits are only as fresh as the version they are asked for.
		{"driver upgraded, not yet discovered", "580.82.07", "580.65.06", 1, "580.65.06"},
		{"upgrade discovered", "580.82.07", "580.82.07", 2, "580.82.07"},
		{"after the upgrade", "580.82.07", "580.82.07", 2, "580.82.07"},
		{"rolled back", "580.65.06", "580.65.06", 3, "580.65.06"},
	}
	for _, s := range steps {
		fake.install(s.installed)
		got, err := e.CommonEdits(ctx, s.reported)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if c := fake.callCount(); c != s.wantCalls {
			t.Errorf("%s: nvcdi called %d times in all, want %d", s.name, c, s.wantCalls)
		}
		if want := sharedEdits("/run/nvidia/driver", s.wantLibs); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: edits\n got %s\nwant %s", s.name, dump(got), dump(want))
		}
	}
	want := NVCDIOptions{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/driver-root", DevRoot: "/driver-root", HookPath: DefaultNVIDIACDIHookPath}
	for i, o := range fake.opts {
		if o != want {
			t.Errorf("nvcdi call %d got options %+v, want %+v", i+1, o, want)
		}
	}
}

// TestNVCDIEditsFailureNotCached: a failure is returned and the next call
// asks again; the edits found then are kept.
func TestNVCDIEditsFailureNotCached(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	e, fake := newFakeEdits(t)
	errNoNVML := errors.New("nvcdi: libnvidia-ml.so.1 not found")
	fake.fail(errNoNVML)
	for i := range 2 {
		if got, err := e.CommonEdits(ctx, testDriverVersion); !errors.Is(err, errNoNVML) || got != nil {
			t.Fatalf("call %d: got %v, %v; want the nvcdi error", i+1, got, err)
		}
	}
	fake.fail(nil)
	for range 2 {
		if _, err := e.CommonEdits(ctx, testDriverVersion); err != nil {
			t.Fatal(err)
		}
	}
	if c := fake.callCount(); c != 3 {
		t.Errorf("nvcdi called %d times, want 3 (two failures, one success)", c)
	}
}

// TestNVCDIEditsConcurrent: claims prepared at once share one nvcdi call.
func TestNVCDIEditsConcurrent(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	e, fake := newFakeEdits(t)
	const claims = 16
	results := make([]*cdispec.ContainerEdits, claims)
	var wg sync.WaitGroup
	for i := range claims {
		wg.Go(func() {
			got, err := e.CommonEdits(ctx, testDriverVersion)
			if err != nil {
				t.Error(err)
			}
			results[i] = got
		})
	}
	wg.Wait()
	if c := fake.callCount(); c != 1 {
		t.Errorf("nvcdi called %d times, want 1", c)
	}
	for i, r := range results {
		if r != results[0] {
			t.Errorf("claim %d got other edits than claim 0", i)
		}
	}
}

// TestNVCDIEditsContextCancelled: a caller whose context ends stops waiting
// for a slow nvcdi call that another caller started.
func TestNVCDIEditsContextCancelled(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	e, _ := newFakeEdits(t)
	started, release := make(chan struct{}), make(chan struct{})
	slow := e.generate
	e.generate = func(l klog.Logger, o NVCDIOptions) (*cdispec.ContainerEdits, error) {
		close(started)
		<-release
		return slow(l, o)
	}
	first := make(chan error, 1)
	go func() {
		_, err := e.CommonEdits(ctx, testDriverVersion)
		first <- err
	}()
	<-started

	waiting, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	got, err := e.CommonEdits(waiting, testDriverVersion)
	if !errors.Is(err, context.DeadlineExceeded) || got != nil {
		t.Errorf("waiting call: got %v, %v; want a deadline error", got, err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first call: %v", err)
	}
}

func dump(v any) string { return fmt.Sprintf("%+v", deref(v)) }

// deref shows pointed-to values in failure messages.
func deref(v any) any {
	switch v := v.(type) {
	case *cdispec.ContainerEdits:
		if v == nil {
			return nil
		}
		out := fmt.Sprintf("env %q", v.Env)
		for _, n := range v.DeviceNodes {
			out += fmt.Sprintf("\n  node %+v", *n)
		}
		for _, m := range v.Mounts {
			out += fmt.Sprintf("\n  mount %+v", *m)
		}
		for _, h := range v.Hooks {
			out += fmt.Sprintf("\n  hook %+v", *h)
		}
		return out
	case []*cdispec.DeviceNode:
		var out []cdispec.DeviceNode
		for _, n := range v {
			out = append(out, *n)
		}
		return out
	}
	return v
}
