// Package cdi builds and writes the per-claim CDI specs that tell the
// container runtime which device nodes, environment and driver files a
// container gets.
//
// One transient spec is written per claim, named after the claim UID, so a
// runtime that caches specs can never confuse two claims. Device nodes carry
// type, major and minor, so the specs resolve on machines where the nodes do
// not exist (simulated nodes, tests) and runtimes need not stat the host.
package cdi

import (
	"fmt"
	"slices"

	"golang.org/x/mod/semver"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Class is the CDI class of gpudra's per-claim devices.
const Class = "claim"

// DeviceClass is the CDI class of the device-plugin mode's devices: one
// spec for the node, a CDI device per GPU or MIG device, named as the
// device model names it (k8s.gpu.nvidia.com/device=gpu-0).
const DeviceClass = "device"

// Fixed minor numbers of the NVIDIA driver's control and UVM nodes.
const (
	nvidiactlMinor    = 255
	uvmMinor          = 0
	uvmToolsMinor     = 1
	charDevice        = "c"
	visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
)

// Vendor returns the CDI vendor for a DRA driver name: "k8s." + driver,
// e.g. "k8s.gpu.nvidia.com".
func Vendor(driverName string) string { return "k8s." + driverName }

// Kind returns the CDI kind ("vendor/class") of the driver's claim devices.
func Kind(driverName string) string { return Vendor(driverName) + "/" + Class }

// DeviceName is the CDI device name of one allocated device of a claim. It
// contains the claim UID, so it is never reused across claims.
func DeviceName(claimUID, deviceName string) string { return claimUID + "-" + deviceName }

// DeviceID is the fully qualified CDI device ID handed to the kubelet.
func DeviceID(driverName, claimUID, deviceName string) string {
	return Kind(driverName) + "=" + DeviceName(claimUID, deviceName)
}

// ShareName is the name, within a claim, of one share of a shareable
// device (a fractional GPU): the device name and the share ID, so that two
// shares of one device in a claim get CDI devices of their own.
func ShareName(deviceName, shareID string) string {
	if shareID == "" {
		return deviceName
	}
	return deviceName + "-" + shareID
}

// SpecDevice is one CDI device of a claim: an allocated device, or one
// share of it.
type SpecDevice struct {
	Device *devicemodel.Device
	// ShareID is set for a share of a shareable device; the CDI device is
	// then named [ShareName](device, ShareID).
	ShareID string
	// Edits, if set, are added to the device's own edits: the directories
	// and environment of the MPS daemon that serves it.
	Edits *cdispec.ContainerEdits
}

// Whole returns the SpecDevices of devices allocated whole, with no edits
// of their own.
func Whole(devices ...*devicemodel.Device) []SpecDevice {
	out := make([]SpecDevice, len(devices))
	for i, d := range devices {
		out[i] = SpecDevice{Device: d}
	}
	return out
}

// SpecInput is everything the spec of one claim is built from.
type SpecInput struct {
	DriverName string
	// ClaimUID is the claim's UID; empty for the device-plugin mode's
	// node-wide spec of class [DeviceClass], whose devices are named as
	// the device model names them.
	ClaimUID string
	Majors   hardware.Majors
	Devices  []SpecDevice
	// Common are container edits every device of the claim needs besides
	// the device nodes: driver libraries, hooks (from nvcdi on real nodes).
	// May be nil.
	Common *cdispec.ContainerEdits
}

// BuildSpec builds the CDI spec of one claim. It is pure. A VFIO device
// gets only the nodes its Edits name: its container drives the GPU through
// VFIO, not through NVIDIA's driver, so a claim of VFIO devices only gets
// none of the driver's nodes and files either.
func BuildSpec(in SpecInput) (*cdispec.Spec, error) {
	// Claims of VFIO devices or IMEX channels only need none of the
	// driver's GPU device nodes.
	gpuFree := len(in.Devices) > 0 && !slices.ContainsFunc(in.Devices, func(d SpecDevice) bool { return usesGPUNodes(d.Device.Kind) })
	if gpuFree {
		return buildSpec(in, cdispec.ContainerEdits{})
	}
	if in.Majors.NVIDIA == 0 || in.Majors.UVM == 0 {
		return nil, fmt.Errorf("device majors unknown (nvidia=%d, nvidia-uvm=%d): cannot describe device nodes", in.Majors.NVIDIA, in.Majors.UVM)
	}
	// The slices are copied so that appending never writes into the
	// caller's shared edits; the elements themselves are never modified.
	common := cdispec.ContainerEdits{}
	if in.Common != nil {
		common = *in.Common
		common.Env = append([]string(nil), in.Common.Env...)
		common.DeviceNodes = append([]*cdispec.DeviceNode(nil), in.Common.DeviceNodes...)
	}
	// Like the NVIDIA container toolkit's specs: the spec already carries
	// everything, so a legacy runtime hook must inject nothing more.
	common.Env = append(common.Env, visibleDevicesEnv+"=void")
	common.DeviceNodes = append(common.DeviceNodes,
		charNode("/dev/nvidiactl", in.Majors.NVIDIA, nvidiactlMinor),
		charNode("/dev/nvidia-uvm", in.Majors.UVM, uvmMinor),
		charNode("/dev/nvidia-uvm-tools", in.Majors.UVM, uvmToolsMinor),
	)
	return buildSpec(in, common)
}

func buildSpec(in SpecInput, common cdispec.ContainerEdits) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{
		Kind:           Kind(in.DriverName),
		ContainerEdits: common,
	}
	if in.ClaimUID == "" {
		spec.Kind = Vendor(in.DriverName) + "/" + DeviceClass
	}
	for _, sd := range in.Devices {
		d := sd.Device
		var nodes []*cdispec.DeviceNode
		if usesGPUNodes(d.Kind) {
			nodes = append(nodes, charNode(fmt.Sprintf("/dev/nvidia%d", d.GPU.Minor), in.Majors.NVIDIA, d.GPU.Minor))
		}
		if d.MIG != nil {
			if in.Majors.Caps == 0 {
				return nil, fmt.Errorf("device %s: nvidia-caps major unknown: cannot describe MIG access nodes", d.Name())
			}
			nodes = append(nodes,
				charNode(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", d.MIG.GICapMinor), in.Majors.Caps, d.MIG.GICapMinor),
				charNode(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", d.MIG.CICapMinor), in.Majors.Caps, d.MIG.CICapMinor),
			)
		}
		edits := cdispec.ContainerEdits{DeviceNodes: nodes}
		if e := sd.Edits; e != nil {
			edits.Env = append(edits.Env, e.Env...)
			edits.DeviceNodes = append(edits.DeviceNodes, e.DeviceNodes...)
			edits.Mounts = append(edits.Mounts, e.Mounts...)
			edits.Hooks = append(edits.Hooks, e.Hooks...)
		}
		name := ShareName(d.Name(), sd.ShareID)
		if in.ClaimUID != "" {
			name = DeviceName(in.ClaimUID, name)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           name,
			ContainerEdits: edits,
		})
	}
	if err := setVersion(spec); err != nil {
		return nil, err
	}
	return spec, nil
}

// SpecVersion is the CDI version of every spec gpudra writes, unless one
// needs a newer version's feature: the lowest version with everything a
// claim's spec uses (device names that start with a digit, a claim UID's
// first character, need 0.5.0; spec annotations 0.6.0). Taking the
// minimum a spec needs would make the version depend on the claim UID.
const SpecVersion = "0.6.0"

// setVersion sets spec's version: SpecVersion, or the minimum the spec
// needs where that is newer.
func setVersion(spec *cdispec.Spec) error {
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI spec version: %w", err)
	}
	if semver.Compare("v"+v, "v"+SpecVersion) < 0 {
		v = SpecVersion
	}
	spec.Version = v
	return nil
}

// usesGPUNodes reports whether a device of kind reaches the container
// through the driver's GPU device nodes (/dev/nvidia<minor>, nvidiactl,
// nvidia-uvm): full GPUs and MIG devices do; VFIO devices and the IMEX
// channel and daemon devices bring their own nodes (as configurator
// edits).
func usesGPUNodes(kind devicemodel.Kind) bool {
	switch kind {
	case devicemodel.KindVFIO, devicemodel.KindChannel, devicemodel.KindDaemon:
		return false
	}
	return true
}

func charNode(path string, major, minor int) *cdispec.DeviceNode {
	return &cdispec.DeviceNode{Path: path, Type: charDevice, Major: int64(major), Minor: int64(minor)}
}
