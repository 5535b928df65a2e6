package deviceplugin

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Resource is one extended resource the node advertises, with its devices.
type Resource struct {
	// Name is the resource name: nvidia.com/gpu, nvidia.com/mig-1g.10gb,
	// or a time-sliced resource's (possibly renamed) name.
	Name    string
	Devices []Device
	// Replicas is the number of replicas of each device (0: not shared).
	Replicas int
	// FailRequestsGreaterThanOne refuses a container asking for more than
	// one replica.
	FailRequestsGreaterThanOne bool
	// MPS: the replicas are clients of an MPS daemon per GPU, each capped
	// at 1/Replicas of the GPU's SMs and memory.
	MPS bool
}

// Device is one advertised device: a full GPU, a MIG device, or one
// replica of either.
type Device struct {
	// ID is what the kubelet sees: the GPU or MIG UUID (or index, with the
	// index strategy), "::<n>" appended for replica n.
	ID string
	// Device is the underlying device in gpudra's device model; its name
	// (gpu-0, gpu-0-mig-1g.10gb-19-0) names its CDI device, or with MPS
	// replicas its name and "-mps" (the GPU and its daemon's directories).
	Device *devicemodel.Device
	// MPS is set for a replica served by the GPU's MPS daemon.
	MPS bool
}

// MPSShare is the share ID of an MPS replica's CDI device
// (gpu-0-mps: cdi.ShareName).
const MPSShare = "mps"

// CDIName is the name of the device's CDI device in the plugin's spec.
func (d *Device) CDIName() string {
	if d.MPS {
		return d.Device.Name() + "-" + MPSShare
	}
	return d.Device.Name()
}

// UUID is the UUID of the underlying GPU or MIG device.
func (d *Device) UUID() string { return d.Device.UUID() }

// NUMANode is the NUMA node of the device's GPU, or nil.
func (d *Device) NUMANode() *int { return d.Device.GPU.NUMANode }

// PlanOptions choose what the node advertises.
type PlanOptions struct {
	// MIGStrategy is none (default), single or mixed, as NVIDIA's.
	MIGStrategy string
	// DeviceIDStrategy is uuid (default) or index.
	DeviceIDStrategy string
	// TimeSlicing are the time-sliced resources.
	TimeSlicing ReplicatedResources
	// MPS are the resources shared through MPS daemons, one per GPU.
	MPS ReplicatedResources
}

// Plan turns a node's inventory into the resources it advertises. A
// config the node's GPUs cannot satisfy is an error naming the field: MIG
// devices the strategy cannot serve, a replicated device that does not
// exist. Resources come sorted by name.
func Plan(inv *hardware.Inventory, o PlanOptions) ([]Resource, error) {
	if o.MIGStrategy == "" {
		o.MIGStrategy = MIGStrategyNone
	}
	if o.DeviceIDStrategy == "" {
		o.DeviceIDStrategy = DeviceIDUUID
	}
	model, err := devicemodel.Build(inv)
	if err != nil {
		return nil, err
	}
	byName := map[string]*Resource{}
	add := func(resource string, d *devicemodel.Device, id string) {
		r := byName[resource]
		if r == nil {
			r = &Resource{Name: resource}
			byName[resource] = r
		}
		r.Devices = append(r.Devices, Device{ID: id, Device: d})
	}
	gpuDevice := func(gpu hardware.GPU) *devicemodel.Device {
		if d, ok := model.Lookup(devicemodel.GPUName(gpu.Minor)); ok {
			return d
		}
		// A GPU in MIG mode, advertised whole (strategy none): it has no
		// full-GPU device in the model, which publishes its MIG devices.
		return &devicemodel.Device{Kind: devicemodel.KindGPU, GPU: gpu, API: resourceapi.Device{Name: devicemodel.GPUName(gpu.Minor)}}
	}
	gpuID := func(gpu hardware.GPU) string {
		if o.DeviceIDStrategy == DeviceIDIndex {
			return strconv.Itoa(gpu.Index)
		}
		return gpu.UUID
	}
	migID := func(gpu hardware.GPU, i int) string {
		if o.DeviceIDStrategy == DeviceIDIndex {
			return fmt.Sprintf("%d:%d", gpu.Index, i)
		}
		return gpu.MIGDevices[i].UUID
	}
	migDevice := func(gpu hardware.GPU, m hardware.MIGDevice) (*devicemodel.Device, error) {
		name := devicemodel.MIGName(gpu.Minor, m.Profile, m.ProfileID, m.PlacementStart)
		d, ok := model.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("GPU %d: MIG device %s (%s) is not in the device model", gpu.Index, m.UUID, m.Profile)
		}
		return d, nil
	}

	// single serves MIG devices only: a GPU whose MIG mode or MIG devices
	// discovery could not read has none to serve, and stays out of it (the
	// plugin's log names what was unread), as it did when discovery left
	// such GPUs out.
	var inMIG, whole []int
	unknownMIG := func(g hardware.GPU) bool {
		return g.IsUnread(hardware.PropertyMIGMode) || g.IsUnread(hardware.PropertyMIGDevices)
	}
	for _, g := range inv.GPUs {
		if unknownMIG(g) {
			continue
		}
		if g.MIGEnabled {
			inMIG = append(inMIG, g.Index)
		} else {
			whole = append(whole, g.Index)
		}
	}
	strategy := o.MIGStrategy
	if strategy == MIGStrategySingle && len(inMIG) == 0 {
		strategy = MIGStrategyNone // nothing in MIG mode: single serves GPUs as none does
	}
	switch strategy {
	case MIGStrategyNone:
		for _, g := range inv.GPUs {
			add(ResourceGPU, gpuDevice(g), gpuID(g))
		}
	case MIGStrategySingle:
		if len(whole) > 0 {
			return nil, fmt.Errorf("flags.migStrategy single: GPUs %v are in MIG mode and GPUs %v are not; single needs every GPU in MIG mode with one profile (use mixed)", inMIG, whole)
		}
		profile := ""
		for _, g := range inv.GPUs {
			if unknownMIG(g) {
				continue
			}
			if len(g.MIGDevices) == 0 {
				return nil, fmt.Errorf("flags.migStrategy single: GPU %d is in MIG mode with no MIG devices", g.Index)
			}
			for i, m := range g.MIGDevices {
				if profile == "" {
					profile = m.Profile
				}
				if m.Profile != profile {
					return nil, fmt.Errorf("flags.migStrategy single: MIG devices of profiles %s and %s (GPU %d); single needs one profile on every GPU (use mixed)", profile, m.Profile, g.Index)
				}
				d, err := migDevice(g, m)
				if err != nil {
					return nil, err
				}
				add(ResourceGPU, d, migID(g, i))
			}
		}
	case MIGStrategyMixed:
		for _, g := range inv.GPUs {
			if !g.MIGEnabled {
				add(ResourceGPU, gpuDevice(g), gpuID(g))
				continue
			}
			for i, m := range g.MIGDevices {
				d, err := migDevice(g, m)
				if err != nil {
					return nil, err
				}
				add(MIGResource(m.Profile), d, migID(g, i))
			}
		}
	default:
		return nil, fmt.Errorf("flags.migStrategy %q: must be one of %s", o.MIGStrategy, strings.Join(MIGStrategies, ", "))
	}

	if err := replicate(byName, inv, "sharing.timeSlicing", o.TimeSlicing, false); err != nil {
		return nil, err
	}
	if err := replicate(byName, inv, "sharing.mps", o.MPS, true); err != nil {
		return nil, err
	}
	out := make([]Resource, 0, len(byName))
	for _, r := range byName {
		if len(r.Devices) > 0 {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// MIGResource is the mixed strategy's resource of a MIG profile:
// nvidia.com/mig-1g.10gb.
func MIGResource(profile string) string { return "nvidia.com/mig-" + profile }

// ReplicaSeparator joins a device's ID and its replica number.
const ReplicaSeparator = "::"

// replicate turns the time-sliced resources' devices into replicas. A
// resource the node does not have is skipped (one config serves nodes of
// every kind); a device the config names that the node lacks is an error.
func replicate(byName map[string]*Resource, inv *hardware.Inventory, field string, ts ReplicatedResources, mps bool) error {
	for i, rr := range ts.Resources {
		path := fmt.Sprintf("%s.resources[%d]", field, i)
		r := byName[rr.Name]
		if r == nil {
			continue
		}
		chosen, err := chooseDevices(r.Devices, rr.Devices, inv, path)
		if err != nil {
			return err
		}
		name := rr.Rename
		if name == "" && ts.RenameByDefault {
			name = rr.Name + ".shared"
		}
		if name == "" {
			name = rr.Name
		}
		var kept, replicated []Device
		for j, d := range r.Devices {
			if !chosen[j] {
				kept = append(kept, d)
				continue
			}
			if mps && d.Device.MIG != nil {
				return fmt.Errorf("%s: %s is a MIG device; MPS replicas are served for full GPUs only", path, d.ID)
			}
			for n := range rr.Replicas {
				replicated = append(replicated, Device{ID: d.ID + ReplicaSeparator + strconv.Itoa(n), Device: d.Device, MPS: mps})
			}
		}
		shared := &Resource{Name: name, Devices: replicated, Replicas: rr.Replicas, FailRequestsGreaterThanOne: ts.FailRequestsGreaterThanOne, MPS: mps}
		if name == rr.Name {
			if len(kept) > 0 {
				return fmt.Errorf("%s.devices: replicates some of %s's devices and not others under the same name; set rename (or renameByDefault) so the two can be told apart", path, rr.Name)
			}
			byName[name] = shared
			continue
		}
		if byName[name] != nil {
			return fmt.Errorf("%s.rename %q: the node advertises that resource already", path, name)
		}
		r.Devices = kept
		byName[name] = shared
	}
	return nil
}

// chooseDevices returns which of devs a replica device list selects.
func chooseDevices(devs []Device, sel ReplicaDevices, inv *hardware.Inventory, path string) (map[int]bool, error) {
	chosen := map[int]bool{}
	switch {
	case sel.Count > 0:
		if sel.Count > len(devs) {
			return nil, fmt.Errorf("%s.devices %d: the node has %d such devices", path, sel.Count, len(devs))
		}
		for j := range sel.Count {
			chosen[j] = true
		}
	case len(sel.List) > 0:
		for _, ref := range sel.List {
			j := slices.IndexFunc(devs, func(d Device) bool { return matches(d, ref, inv) })
			if j < 0 {
				return nil, fmt.Errorf("%s.devices: %q names no device of this node's %d (GPUs %s)", path, ref, len(devs), gpuList(inv))
			}
			chosen[j] = true
		}
	default:
		for j := range devs {
			chosen[j] = true
		}
	}
	return chosen, nil
}

// matches reports whether ref (index, MIG index or UUID) names d.
func matches(d Device, ref string, inv *hardware.Inventory) bool {
	g := d.Device.GPU
	if d.Device.MIG == nil {
		return ref == g.UUID || ref == strconv.Itoa(g.Index)
	}
	if ref == d.Device.MIG.UUID {
		return true
	}
	for i, m := range g.MIGDevices {
		if m.UUID == d.Device.MIG.UUID {
			return ref == fmt.Sprintf("%d:%d", g.Index, i) || ref == fmt.Sprintf("MIG-%s/%d/%d", g.UUID, m.GIID, m.CIID)
		}
	}
	return false
}

func gpuList(inv *hardware.Inventory) string {
	var parts []string
	for _, g := range inv.GPUs {
		parts = append(parts, fmt.Sprintf("%d=%s", g.Index, g.UUID))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
