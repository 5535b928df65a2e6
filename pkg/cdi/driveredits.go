package cdi

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultNVIDIACDIHookPath is where the NVIDIA container toolkit installs
// nvidia-cdi-hook on a host, and the toolkit library's own default.
const DefaultNVIDIACDIHookPath = "/usr/bin/nvidia-cdi-hook"

// DriverEdits supplies the container edits for the NVIDIA driver's
// user-space side: libraries, binaries, IPC sockets and the hooks that make
// them usable. They are the same for every claim on a node while one driver
// version is installed.
type DriverEdits interface {
	// CommonEdits returns the edits of the driver installed now, with
	// host paths as the container runtime must see them. driverVersion is
	// the version discovery last found; the edits may be reused for as
	// long as it stays the same, and are found again when it changes
	// (after a driver container upgrade the versioned libraries have other
	// names). The returned edits are shared: callers must not modify them.
	// Nil edits with a nil error mean there are no driver files to add.
	CommonEdits(ctx context.Context, driverVersion string) (*cdispec.ContainerEdits, error)
}

// NoDriverEdits is the DriverEdits of simulated nodes and tests: no driver
// files at all.
type NoDriverEdits struct{}

// CommonEdits implements [DriverEdits].
func (NoDriverEdits) CommonEdits(context.Context, string) (*cdispec.ContainerEdits, error) {
	return nil, nil
}

// NVCDIOptions configure the NVIDIA container toolkit's CDI library.
//
// Two views of one driver installation meet here. The plugin usually runs
// in a container and sees the driver where the host's driver root is
// mounted into it (ContainerDriverRoot); the container runtime that reads
// the CDI specs runs on the host and needs the host's paths (DriverRoot).
// nvcdi searches the first; every host path in its edits is translated to
// the second.
type NVCDIOptions struct {
	// DriverRoot is the driver root on the host, as CDI specs must name
	// it: "/" for a host-installed driver, "/run/nvidia/driver" with the
	// GPU operator's driver container.
	DriverRoot string
	// ContainerDriverRoot is where the plugin sees DriverRoot; defaults to
	// DriverRoot (a plugin running on the host, or one that mounts the
	// driver root at the same path).
	ContainerDriverRoot string
	// DevRoot is where the plugin sees the device nodes; defaults to
	// ContainerDriverRoot. Nodes under ContainerDriverRoot are named under
	// DriverRoot in the specs, others by their path as it is.
	DevRoot string
	// HookPath is the path of nvidia-cdi-hook on the host; it is written
	// into the specs as it is. Defaults to [DefaultNVIDIACDIHookPath].
	HookPath string
}

// NVCDIEdits gets the driver edits from nvcdi and keeps them for one driver
// version: finding the driver's files takes NVML and a walk of the driver
// root, too slow to repeat for every claim.
type NVCDIEdits struct {
	opts NVCDIOptions
	// generate returns the driver's edits as the plugin sees them, before
	// any path is translated; nvcdi's GetCommonEdits outside tests.
	generate func(klog.Logger, NVCDIOptions) (*cdispec.ContainerEdits, error)

	// lock is a mutex that a cancelled context stops waiting for: a slow
	// nvcdi call must not pin every prepare behind it past its deadline.
	lock    chan struct{}
	version string
	edits   *cdispec.ContainerEdits
}

// NewNVCDIEdits returns DriverEdits backed by nvcdi. It does not touch the
// driver: the first CommonEdits call does.
func NewNVCDIEdits(opts NVCDIOptions) *NVCDIEdits {
	if opts.DriverRoot == "" {
		opts.DriverRoot = "/"
	}
	if opts.ContainerDriverRoot == "" {
		opts.ContainerDriverRoot = opts.DriverRoot
	}
	if opts.DevRoot == "" {
		opts.DevRoot = opts.ContainerDriverRoot
	}
	if opts.HookPath == "" {
		opts.HookPath = DefaultNVIDIACDIHookPath
	}
	return &NVCDIEdits{opts: opts, generate: nvcdiCommonEdits, lock: make(chan struct{}, 1)}
}

// CommonEdits implements [DriverEdits]. A failure is not remembered: the
// driver may come up later, and the next call asks nvcdi again.
func (e *NVCDIEdits) CommonEdits(ctx context.Context, driverVersion string) (*cdispec.ContainerEdits, error) {
	cancelled := func() error {
		return fmt.Errorf("driver files of driver %s: %w", driverVersion, context.Cause(ctx))
	}
	select {
	case e.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, cancelled()
	}
	defer func() { <-e.lock }()
	if e.edits != nil && e.version == driverVersion {
		return e.edits, nil
	}
	if ctx.Err() != nil {
		return nil, cancelled()
	}
	logger := klog.FromContext(ctx)
	if e.edits != nil {
		logger.Info("Driver version changed, finding the driver's files again", "previousVersion", e.version, "driverVersion", driverVersion)
	}
	raw, err := e.generate(logger, e.opts)
	if err != nil {
		return nil, err
	}
	edits := hostEdits(raw, e.opts)
	e.version, e.edits = driverVersion, edits
	logger.V(2).Info("Found the driver's files for CDI specs", "driverVersion", driverVersion,
		"driverRoot", e.opts.DriverRoot, "containerDriverRoot", e.opts.ContainerDriverRoot,
		"mounts", len(edits.Mounts), "hooks", len(edits.Hooks), "deviceNodes", len(edits.DeviceNodes))
	return edits, nil
}

// nvcdiCommonEdits asks nvcdi for the driver's edits, searching the driver
// root as the plugin sees it.
func nvcdiCommonEdits(logger klog.Logger, o NVCDIOptions) (*cdispec.ContainerEdits, error) {
	lib, err := nvcdi.New(
		nvcdi.WithLogger(nvcdiLogger{logger}),
		nvcdi.WithDriverRoot(o.ContainerDriverRoot),
		nvcdi.WithDevRoot(o.DevRoot),
		nvcdi.WithNVIDIACDIHookPath(o.HookPath),
		nvcdi.WithMode(nvcdi.ModeNvml),
		// Only per-GPU specs use nvsandboxutils, and gpudra asks for the
		// common edits alone: do not load and initialise the library.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	)
	if err != nil {
		return nil, fmt.Errorf("nvcdi: %w", err)
	}
	edits, err := lib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("nvcdi: driver files under %s: %w", o.ContainerDriverRoot, err)
	}
	if edits == nil || edits.ContainerEdits == nil {
		return nil, fmt.Errorf("nvcdi returned no edits for driver root %s", o.ContainerDriverRoot)
	}
	return edits.ContainerEdits, nil
}

// hostEdits turns nvcdi's edits into the ones every claim's spec shares:
// what BuildSpec adds itself is dropped, so that nothing appears twice, and
// host paths are translated from the plugin's view to the host's. raw is
// not modified.
func hostEdits(raw *cdispec.ContainerEdits, o NVCDIOptions) *cdispec.ContainerEdits {
	out := *raw
	out.Env = nil
	for _, env := range raw.Env {
		// BuildSpec sets NVIDIA_VISIBLE_DEVICES=void; nvcdi does too.
		if name, _, _ := strings.Cut(env, "="); name == visibleDevicesEnv {
			continue
		}
		out.Env = append(out.Env, env)
	}
	tr := rootTranslator{container: o.ContainerDriverRoot, host: o.DriverRoot}
	out.DeviceNodes = nil
	for _, n := range raw.DeviceNodes {
		// BuildSpec adds the control and UVM nodes with explicit majors.
		switch n.Path {
		case "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools":
			continue
		}
		out.DeviceNodes = append(out.DeviceNodes, tr.deviceNode(n))
	}
	out.Mounts = nil
	for _, m := range raw.Mounts {
		out.Mounts = append(out.Mounts, tr.mount(m))
	}
	out.Hooks = nil
	for _, h := range raw.Hooks {
		out.Hooks = append(out.Hooks, tr.hook(h))
	}
	return &out
}

// rootTranslator translates paths under the driver root as the plugin sees
// it (container) to the same files under the host's driver root (host).
// Paths elsewhere are left as they are.
type rootTranslator struct {
	container string
	host      string
}

// path returns p as the host names it.
func (t rootTranslator) path(p string) string {
	if filepath.Clean(t.container) == filepath.Clean(t.host) || !filepath.IsAbs(p) {
		return p
	}
	rel, err := filepath.Rel(t.container, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return p
	}
	return filepath.Join(t.host, rel)
}

// mount translates the host side of a mount; the container side is the
// workload container's and stays.
func (t rootTranslator) mount(m *cdispec.Mount) *cdispec.Mount {
	c := *m
	c.HostPath = t.path(m.HostPath)
	return &c
}

// deviceNode translates the host side of a device node. An empty HostPath
// means Path on the host, so Path is translated into HostPath then.
func (t rootTranslator) deviceNode(n *cdispec.DeviceNode) *cdispec.DeviceNode {
	c := *n
	hostPath := n.HostPath
	if hostPath == "" {
		hostPath = n.Path
	}
	if translated := t.path(hostPath); translated != hostPath {
		c.HostPath = translated
	}
	if c.HostPath == c.Path {
		// Equivalent, and the form nvcdi writes.
		c.HostPath = ""
	}
	return &c
}

// hook translates the arguments of hooks that run on the host. The hook's
// Path is nvidia-cdi-hook's path on the host as configured, never a file
// under the plugin's view of the driver root, so it stays. Hooks that run
// in the workload container's namespaces (createContainer, startContainer:
// every hook nvcdi makes today) name the container's paths in their
// arguments, which must stay too.
func (t rootTranslator) hook(h *cdispec.Hook) *cdispec.Hook {
	c := *h
	switch h.HookName {
	case cdiapi.CreateContainerHook, cdiapi.StartContainerHook:
		return &c
	}
	c.Args = make([]string, len(h.Args))
	for i, arg := range h.Args {
		// create-symlinks takes target::link pairs.
		if target, link, ok := strings.Cut(arg, "::"); ok {
			c.Args[i] = t.path(target) + "::" + t.path(link)
			continue
		}
		c.Args[i] = t.path(arg)
	}
	return &c
}

// nvcdiLogger adapts klog to the logger nvcdi expects.
type nvcdiLogger struct{ l klog.Logger }

func (n nvcdiLogger) Debugf(f string, a ...any) {
	n.l.V(5).Info(fmt.Sprintf(f, a...), "source", "nvcdi")
}
func (n nvcdiLogger) Tracef(f string, a ...any) {
	n.l.V(6).Info(fmt.Sprintf(f, a...), "source", "nvcdi")
}
func (n nvcdiLogger) Infof(f string, a ...any) {
	n.l.V(2).Info(fmt.Sprintf(f, a...), "source", "nvcdi")
}
func (n nvcdiLogger) Warningf(f string, a ...any) {
	n.l.Info("Warning: "+fmt.Sprintf(f, a...), "source", "nvcdi")
}
func (n nvcdiLogger) Errorf(f string, a ...any) {
	n.l.Error(nil, fmt.Sprintf(f, a...), "source", "nvcdi")
}
