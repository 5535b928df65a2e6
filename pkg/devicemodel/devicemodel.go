// Package devicemodel turns a hardware snapshot into the devices gpudra
// publishes. It is pure and deterministic: the same inventory always gives
// the same devices in the same order, with the names, attributes and
// capacities of NVIDIA's DRA driver so that CEL selectors written for it
// keep working.
package devicemodel

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// Kind is the kind of an allocatable device; it is also the value of the
// published "type" attribute.
type Kind string

const (
	// KindGPU is a full GPU.
	KindGPU Kind = "gpu"
	// KindMIG is a MIG device.
	KindMIG Kind = "mig"
)

// Attribute and capacity names, as NVIDIA's DRA driver publishes them.
const (
	AttrType                  resourceapi.QualifiedName = "type"
	AttrUUID                  resourceapi.QualifiedName = "uuid"
	AttrParentUUID            resourceapi.QualifiedName = "parentUUID"
	AttrProfile               resourceapi.QualifiedName = "profile"
	AttrIndex                 resourceapi.QualifiedName = "index"
	AttrMinor                 resourceapi.QualifiedName = "minor"
	AttrProductName           resourceapi.QualifiedName = "productName"
	AttrBrand                 resourceapi.QualifiedName = "brand"
	AttrArchitecture          resourceapi.QualifiedName = "architecture"
	AttrCUDAComputeCapability resourceapi.QualifiedName = "cudaComputeCapability"
	AttrDriverVersion         resourceapi.QualifiedName = "driverVersion"
	AttrCUDADriverVersion     resourceapi.QualifiedName = "cudaDriverVersion"

	// AttrSharingMode is gpudra's own: on every full GPU, how the node
	// shares it ("none", "memory-compute", "shares", "unlimited"; see
	// WithSharing), for CEL selectors that choose or avoid a mode.
	AttrSharingMode resourceapi.QualifiedName = "sharingMode"

	CapMemory          resourceapi.QualifiedName = "memory"
	CapMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	CapCopyEngines     resourceapi.QualifiedName = "copyEngines"
	CapDecoders        resourceapi.QualifiedName = "decoders"
	CapEncoders        resourceapi.QualifiedName = "encoders"
	CapJPEGEngines     resourceapi.QualifiedName = "jpegEngines"
	CapOFAEngines      resourceapi.QualifiedName = "ofaEngines"
)

// Device is one allocatable device: the API object that is published and
// the hardware it stands for, which Prepare needs.
type Device struct {
	Kind Kind
	// API is the device as published in a ResourceSlice.
	API resourceapi.Device
	// GPU is the full GPU, or the parent GPU of a MIG device.
	GPU hardware.GPU
	// MIG is set for MIG devices that exist: static MIG devices, and
	// dynamic ones whose GPU instance exists now.
	MIG *hardware.MIGDevice
	// Placement is set for dynamic MIG devices (see [WithDynamicMIG]):
	// where Prepare creates the MIG device.
	Placement *Placement
	// Sharing is set for a full GPU published for several claims at once
	// (see [WithSharing]); [Device.ShareLimits] turns what one share
	// consumed into its limits.
	Sharing Sharing
}

// Placement is where a dynamic MIG device goes: a GPU instance profile of
// the parent GPU at a placement start.
type Placement struct {
	// Profile is the GPU instance profile.
	Profile hardware.MIGProfile
	// Start is the placement start in memory slices.
	Start int
}

// MIGPlacement returns the placement in the hardware's terms.
func (d *Device) MIGPlacement() hardware.MIGPlacement {
	return hardware.MIGPlacement{ParentUUID: d.GPU.UUID, ProfileID: d.Placement.Profile.ProfileID, Start: d.Placement.Start}
}

// Name returns the published device name.
func (d *Device) Name() string { return d.API.Name }

// UUID returns the UUID of the GPU or MIG device; "" for a dynamic MIG
// device that does not exist yet.
func (d *Device) UUID() string {
	switch {
	case d.MIG != nil:
		return d.MIG.UUID
	case d.Placement != nil:
		return ""
	}
	return d.GPU.UUID
}

// Model is the set of devices of one node, in publishing order, with the
// shared counters they consume.
type Model struct {
	Devices []Device
	// CounterSets are the counter sets the devices consume from (see
	// [WithDynamicMIG]), one per MIG-capable GPU, in inventory order.
	// Empty without dynamic MIG.
	CounterSets []resourceapi.CounterSet
	byName      map[string]int
}

// Lookup returns the device with the given name.
func (m *Model) Lookup(name string) (*Device, bool) {
	i, ok := m.byName[name]
	if !ok {
		return nil, false
	}
	return &m.Devices[i], true
}

// APIDevices returns the published devices in order.
func (m *Model) APIDevices() []resourceapi.Device {
	out := make([]resourceapi.Device, len(m.Devices))
	for i := range m.Devices {
		out[i] = m.Devices[i].API
	}
	return out
}

// Option configures [Build].
type Option func(*buildOptions)

type buildOptions struct {
	dynamicMIG   bool
	modeSwitchOK func(hardware.GPU) bool
	vfioMode     VFIOMode
	vfioInfo     VFIOInfoFunc
	sharing      Sharing
	taints       func(gpuUUID string) []resourceapi.DeviceTaint
	foreignMIG   func(gpu *hardware.GPU, mig *hardware.MIGDevice) bool
}

// WithTaints puts the taints taints returns for a GPU (KEP-5055) on every
// device of that GPU: the full GPU, its VFIO device, its MIG devices and
// dynamic MIG placements. A device with taints counts as one with advanced
// features for the slice size limit.
func WithTaints(taints func(gpuUUID string) []resourceapi.DeviceTaint) Option {
	return func(o *buildOptions) { o.taints = taints }
}

// WithDynamicMIG publishes MIG-capable GPUs as partitionable devices
// (KEP-4815) instead of their current MIG devices, so that the scheduler
// picks a place for a MIG device and Prepare creates it there.
//
// Each MIG-capable GPU (one with MIG profiles and memory slices) gets a
// counter set, [CounterSetName], holding its memory, its engines (as much
// as the profile spanning the whole GPU has) and one counter per memory
// slice ([MemorySliceCounter]). A GPU with MIG mode on is published as one
// MIG device per profile and placement start, named as NVIDIA's driver
// names the MIG device it would become, consuming the memory, engines and
// memory slices of that placement; overlapping placements then exclude
// each other through the memory-slice counters. A GPU with MIG mode off is
// published as the full GPU, consuming all of its counters. GPUs that are
// not MIG-capable are published as without this option.
func WithDynamicMIG() Option {
	return func(o *buildOptions) { o.dynamicMIG = true }
}

// WithMIGModeSwitching, next to [WithDynamicMIG], publishes the GPUs for
// which can returns true both as a full GPU and as every MIG placement,
// whatever their MIG mode: Prepare switches the mode as the allocated
// device needs. The shared counters keep the two apart, since the full GPU
// consumes all of them.
func WithMIGModeSwitching(can func(hardware.GPU) bool) Option {
	return func(o *buildOptions) { o.modeSwitchOK = can }
}

// WithForeignMIGDevices, next to [WithDynamicMIG], names the existing MIG
// devices that are not gpudra's to create or destroy (an operator's layout
// on a node migrated from another driver): foreign returns true for them.
// They are published exactly as without dynamic MIG (static MIG devices,
// with their uuid, consuming no counters), and Prepare uses them as they
// are. The GPU's dynamic placements are then only those that overlap no
// foreign device, its counter set holds what the foreign devices leave
// (their memory, engines and memory slices taken out), and its full GPU is
// not offered, since switching MIG mode off would destroy them. Without
// this option every existing MIG device counts as gpudra's.
func WithForeignMIGDevices(foreign func(gpu *hardware.GPU, mig *hardware.MIGDevice) bool) Option {
	return func(o *buildOptions) { o.foreignMIG = foreign }
}

// Build derives the devices of a node from its inventory. A GPU with MIG
// mode on is published through its MIG devices only, as NVIDIA's driver
// does: the full GPU cannot be handed out while it is partitioned. Without
// options, those are the MIG devices that exist now (static MIG); see
// [WithDynamicMIG] for MIG devices created on demand, and [WithSharing]
// for full GPUs shared between claims.
func Build(inv *hardware.Inventory, opts ...Option) (*Model, error) {
	var o buildOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.sharing.Validate(); err != nil {
		return nil, err
	}
	common, err := commonAttributes(inv)
	if err != nil {
		return nil, err
	}
	m := &Model{byName: map[string]int{}}
	for _, gpu := range inv.GPUs {
		gpuAttrs, err := gpuAttributes(gpu, common)
		if err != nil {
			return nil, fmt.Errorf("GPU %d (%s): %w", gpu.Index, gpu.UUID, err)
		}
		var vfio VFIOInfo
		passthrough := false
		// Passthrough binds the GPU's PCI function, which a GPU without a
		// bus ID does not name.
		if o.vfioInfo != nil && gpu.PCIBusID != "" {
			vfio, passthrough = o.vfioInfo(gpu)
		}
		if gpu.VFIODriver != "" {
			// Bound to a VFIO driver by the node's set-up: a VFIO device
			// or nothing, never a CUDA device, and no counters (no other
			// device of the GPU exists to keep apart from).
			if passthrough {
				if err := m.add(Device{Kind: KindVFIO, API: vfioDevice(&gpu, gpuAttrs, vfio), GPU: gpu}); err != nil {
					return nil, err
				}
			}
			continue
		}
		switchable := o.dynamicMIG && isDynamicMIGCapable(&gpu) && o.modeSwitchOK != nil && o.modeSwitchOK(gpu)
		whole := !gpu.MIGEnabled || switchable
		if passthrough && whole && o.vfioMode == VFIOOnly {
			if err := m.add(Device{Kind: KindVFIO, API: vfioDevice(&gpu, gpuAttrs, vfio), GPU: gpu}); err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case o.dynamicMIG && isDynamicMIGCapable(&gpu):
			err = m.addDynamicMIGGPU(gpu, gpuAttrs, switchable, o.foreignMIG)
		case !gpu.MIGEnabled:
			err = m.add(Device{Kind: KindGPU, API: fullGPUDevice(&gpu, gpuAttrs), GPU: gpu})
		default:
			err = m.addStaticMIGDevices(gpu, gpuAttrs)
		}
		if err == nil && passthrough && whole && o.vfioMode == VFIOBeside && gpu.MemoryBytes > 0 {
			err = m.addVFIOBeside(gpu, gpuAttrs, vfio)
		}
		// Every sharing mode divides the GPU's memory (shares cap it at
		// their fraction), so a GPU whose memory is unknown is offered
		// whole only.
		if err == nil && whole && o.sharing.Enabled() && gpu.MemoryBytes > 0 {
			err = m.shareFullGPU(&gpu, o.sharing)
		}
		if err != nil {
			return nil, err
		}
	}
	if o.taints != nil {
		for i := range m.Devices {
			d := &m.Devices[i]
			if ts := o.taints(d.GPU.UUID); len(ts) > 0 {
				d.API.Taints = append(slices.Clone(d.API.Taints), ts...)
			}
		}
	}
	return m, nil
}

// add appends d, keeping device names unique.
func (m *Model) add(d Device) error {
	if _, dup := m.byName[d.API.Name]; dup {
		return fmt.Errorf("device name %q is not unique", d.API.Name)
	}
	m.byName[d.API.Name] = len(m.Devices)
	m.Devices = append(m.Devices, d)
	return nil
}

// fullGPUDevice is the published full GPU.
func fullGPUDevice(gpu *hardware.GPU, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.Device {
	return resourceapi.Device{
		Name: GPUName(gpu.Minor),
		Attributes: withAttrs(gpuAttrs, map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType:  str(string(KindGPU)),
			AttrIndex: {IntValue: ptr.To(int64(gpu.Index))},
			AttrMinor: {IntValue: ptr.To(int64(gpu.Minor))},
			// shareFullGPU sets the mode of a shared GPU.
			AttrSharingMode: str(string(SharingNone)),
		}),
		Capacity: gpuCapacity(gpu),
	}
}

// gpuCapacity is a whole GPU's capacity: its memory, or nothing when that
// is unknown (discovery could not read it), since a capacity of 0 would
// tell the scheduler the GPU has none.
func gpuCapacity(gpu *hardware.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	if gpu.MemoryBytes == 0 {
		return nil
	}
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: bytesCapacity(gpu.MemoryBytes)}
}

// addStaticMIGDevices publishes the MIG devices that exist on gpu.
func (m *Model) addStaticMIGDevices(gpu hardware.GPU, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) error {
	for i := range gpu.MIGDevices {
		if err := m.addStaticMIGDevice(&gpu, gpu.MIGDevices[i], gpuAttrs); err != nil {
			return err
		}
	}
	return nil
}

// addStaticMIGDevice publishes one existing MIG device of gpu as it is.
func (m *Model) addStaticMIGDevice(gpu *hardware.GPU, mig hardware.MIGDevice, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) error {
	api := resourceapi.Device{
		Name:       MIGName(gpu.Minor, mig.Profile, mig.ProfileID, mig.PlacementStart),
		Attributes: migAttributes(gpu, mig.Profile, gpuAttrs),
		Capacity:   migCapacity(deviceResources(&mig), mig.PlacementStart, mig.PlacementSize),
	}
	api.Attributes[AttrUUID] = str(mig.UUID)
	return m.add(Device{Kind: KindMIG, API: api, GPU: *gpu, MIG: &mig})
}

// migAttributes are a MIG device's attributes less its own uuid: those of
// its parent GPU without the parent's uuid, which would mislead, plus type,
// parentUUID and profile.
func migAttributes(gpu *hardware.GPU, profile string, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := withAttrs(gpuAttrs, map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrType:       str(string(KindMIG)),
		AttrParentUUID: str(gpu.UUID),
		AttrProfile:    str(profile),
	})
	delete(attrs, AttrUUID)
	return attrs
}

// migResources are the memory and engines of one MIG device or profile.
type migResources struct {
	memoryBytes                                                               uint64
	multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines int
}

// deviceResources are the memory and engines of an existing MIG device.
func deviceResources(mig *hardware.MIGDevice) migResources {
	return migResources{mig.MemoryBytes, mig.Multiprocessors, mig.CopyEngines, mig.Decoders, mig.Encoders, mig.JPEGEngines, mig.OFAEngines}
}

// migCapacity is a MIG device's capacity: memory, engines, and, as NVIDIA's
// driver publishes them, one "memorySlice<N>" per memory slice it occupies.
func migCapacity(r migResources, start, size int) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	c := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		CapMemory:          bytesCapacity(r.memoryBytes),
		CapMultiprocessors: countCapacity(r.multiprocessors),
		CapCopyEngines:     countCapacity(r.copyEngines),
		CapDecoders:        countCapacity(r.decoders),
		CapEncoders:        countCapacity(r.encoders),
		CapJPEGEngines:     countCapacity(r.jpegEngines),
		CapOFAEngines:      countCapacity(r.ofaEngines),
	}
	for i := start; i < start+size; i++ {
		c[MemorySliceCapacity(i)] = countCapacity(1)
	}
	return c
}

// MemorySliceCapacity is the capacity name of one memory slice of a GPU.
func MemorySliceCapacity(slice int) resourceapi.QualifiedName {
	return resourceapi.QualifiedName(fmt.Sprintf("memorySlice%d", slice))
}

// GPUName is the device name of the full GPU with the given minor number.
func GPUName(minor int) string { return fmt.Sprintf("gpu-%d", minor) }

// MIGName is the device name of a MIG device, in NVIDIA's scheme
// gpu-<minor>-mig-<profile>-<profileID>-<placementStart>. profileID is the
// GPU instance profile's own ID (nvmlGpuInstanceProfileInfo_t.id, 19 for
// 1g.10gb, [hardware.MIGDevice.ProfileID]), which NVIDIA's driver calls the
// GI profile ID; it is not the NVML_GPU_INSTANCE_PROFILE_* index.
func MIGName(parentMinor int, profile string, profileID, placementStart int) string {
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", parentMinor, NormalizeProfile(profile), profileID, placementStart)
}

var notNameChar = regexp.MustCompile(`[^a-z0-9-]`)

// NormalizeProfile turns a MIG profile name into a device-name fragment:
// lower case, dots removed, any other character outside [a-z0-9-] turned
// into '-' ("1g.10gb+me" -> "1g10gb-me"), and no '-' at either end.
func NormalizeProfile(profile string) string {
	p := strings.ReplaceAll(strings.ToLower(profile), ".", "")
	return strings.Trim(notNameChar.ReplaceAllString(p, "-"), "-")
}

func commonAttributes(inv *hardware.Inventory) (map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for name, v := range map[resourceapi.QualifiedName]string{
		AttrDriverVersion:     inv.DriverVersion,
		AttrCUDADriverVersion: inv.CUDADriverVersion,
	} {
		if v == "" {
			continue
		}
		sv, err := SemVer(v)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", name, err)
		}
		attrs[name] = resourceapi.DeviceAttribute{VersionValue: &sv}
	}
	return attrs, nil
}

// gpuAttributes are the attributes of a GPU's devices. What discovery could
// not read (empty in gpu) is left out, never published empty: a selector
// on it then fails to match, where "" or 0 could match by mistake.
func gpuAttributes(gpu hardware.GPU, common map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) (map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	attrs := withAttrs(common, nil)
	// UUID and product name are unknown only for a GPU NVML does not list
	// (hardware.GPU.VFIODriver).
	for name, v := range map[resourceapi.QualifiedName]string{AttrUUID: gpu.UUID, AttrProductName: gpu.ProductName, AttrBrand: gpu.Brand, AttrArchitecture: gpu.Architecture} {
		if v != "" {
			attrs[name] = str(v)
		}
	}
	if gpu.CUDAComputeCapability != "" {
		cc, err := SemVer(gpu.CUDAComputeCapability)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", AttrCUDAComputeCapability, err)
		}
		attrs[AttrCUDAComputeCapability] = resourceapi.DeviceAttribute{VersionValue: &cc}
	}
	if gpu.PCIBusID != "" {
		a, err := deviceattribute.GetPCIBusIDAttribute(gpu.PCIBusID)
		if err != nil {
			return nil, err
		}
		attrs[a.Name] = a.Value
	}
	if gpu.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(gpu.PCIeRoot)
	}
	if gpu.NUMANode != nil {
		a, err := deviceattribute.GetNUMANodeAttribute(*gpu.NUMANode, deviceattribute.ScalarAttribute)
		if err != nil {
			return nil, err
		}
		attrs[a.Name] = a.Value
	}
	return attrs, nil
}

// SemVer turns an NVIDIA version string ("580.65.06", "9.0", "13.0") into
// the strict semantic version the API requires ("580.65.6", "9.0.0").
func SemVer(v string) (string, error) {
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		return "", fmt.Errorf("version %q: %w", v, err)
	}
	return fmt.Sprintf("%d.%d.%d", parsed.Major(), parsed.Minor(), parsed.Patch()), nil
}

func withAttrs(base, extra map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(base)+len(extra))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func bytesCapacity(b uint64) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(b), resource.BinarySI)}
}

func countCapacity(n int) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
}

// AttributeText renders an attribute's value as text, for people and
// tests; ok is false when no value is set.
func AttributeText(a resourceapi.DeviceAttribute) (text string, ok bool) {
	switch {
	case a.StringValue != nil:
		return *a.StringValue, true
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10), true
	case a.VersionValue != nil:
		return *a.VersionValue, true
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue), true
	}
	return "", false
}
