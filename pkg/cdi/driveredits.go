package cdi

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DriverEdits supplies the container edits for the NVIDIA driver's
// user-space side: libraries, binaries, IPC sockets and the hooks that make
// them usable. They are the same for every claim on a node.
type DriverEdits interface {
	CommonEdits() (*cdispec.ContainerEdits, error)
}

// NoDriverEdits is the DriverEdits of simulated nodes and tests: no driver
// files at all.
type NoDriverEdits struct{}

// CommonEdits implements [DriverEdits].
func (NoDriverEdits) CommonEdits() (*cdispec.ContainerEdits, error) { return nil, nil }

// NVCDIOptions configure the NVIDIA container toolkit's CDI library.
type NVCDIOptions struct {
	// DriverRoot is where the driver's files are seen from the plugin
	// ("/" on a host-installed driver, "/run/nvidia/driver" with the
	// driver container).
	DriverRoot string
	// DevRoot is where the device nodes are; defaults to DriverRoot.
	DevRoot string
	// HookPath is the path of nvidia-cdi-hook on the host.
	HookPath string
}

// NVCDIEdits gets the driver edits from nvcdi and caches the first
// successful answer: the driver's files do not change while it is loaded.
type NVCDIEdits struct {
	opts   NVCDIOptions
	logger klog.Logger

	mu    sync.Mutex
	edits *cdispec.ContainerEdits
}

// NewNVCDIEdits returns DriverEdits backed by nvcdi.
func NewNVCDIEdits(logger klog.Logger, opts NVCDIOptions) *NVCDIEdits {
	if opts.DevRoot == "" {
		opts.DevRoot = opts.DriverRoot
	}
	return &NVCDIEdits{opts: opts, logger: logger}
}

// CommonEdits implements [DriverEdits].
func (e *NVCDIEdits) CommonEdits() (*cdispec.ContainerEdits, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.edits != nil {
		return e.edits, nil
	}
	opts := []nvcdi.Option{
		nvcdi.WithLogger(nvcdiLogger{e.logger}),
		nvcdi.WithDriverRoot(e.opts.DriverRoot),
		nvcdi.WithDevRoot(e.opts.DevRoot),
		nvcdi.WithMode(nvcdi.ModeNvml),
	}
	if e.opts.HookPath != "" {
		opts = append(opts, nvcdi.WithNVIDIACDIHookPath(e.opts.HookPath))
	}
	lib, err := nvcdi.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nvcdi: %w", err)
	}
	edits, err := lib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("nvcdi: driver files under %s: %w", e.opts.DriverRoot, err)
	}
	if edits == nil || edits.ContainerEdits == nil {
		return nil, fmt.Errorf("nvcdi returned no edits for driver root %s", e.opts.DriverRoot)
	}
	out := *edits.ContainerEdits
	// BuildSpec adds the control and UVM nodes with explicit majors; drop
	// nvcdi's copies so that no node appears twice.
	out.DeviceNodes = nil
	for _, n := range edits.ContainerEdits.DeviceNodes {
		switch n.Path {
		case "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools":
			continue
		}
		out.DeviceNodes = append(out.DeviceNodes, n)
	}
	e.edits = &out
	return e.edits, nil
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
