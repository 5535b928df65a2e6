// Package vfio is the configurator of VFIO passthrough: GPUs
// published as gpu-vfio-<minor> devices whose IOMMU group is bound to a
// VFIO driver at Prepare and given back at Unprepare. Its record names
// each PCI function and the driver to give it back to before any is
// unbound.
package vfio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/vfio"
)

// Name is the configurator's record name in the checkpoint.
const Name = "vfio"

// Record lists the passed-through GPUs of one claim.
type Record struct {
	Devices []Passthrough `json:"devices"`
}

// Passthrough is one GPU's IOMMU group bound to VFIO: the binder's own
// record (what Bind changes and Restore puts back), with the device it
// was bound for.
type Passthrough struct {
	// Device is the published device name.
	Device string `json:"device"`
	vfio.Record
	// DevicePaths are the VFIO device nodes the container gets, as Apply
	// found them (they depend on the device's config and on whether the
	// kernel offers iommufd): the device metadata names them, and must
	// say the same at every later Prepare. Empty in records written
	// before it was kept.
	DevicePaths []string `json:"devicePaths,omitempty"`
	// GPUInfo is the GPU as discovery saw it when it was planned: NVML no
	// longer lists a GPU bound to a VFIO driver, so a plugin restarted
	// while the GPU is passed through publishes it from here. Nil in
	// records written before it was kept.
	GPUInfo *hardware.GPU `json:"gpuInfo,omitempty"`
}

// Config is what VFIO passthrough needs on this node.
type Config struct {
	// Mode is how GPUs are offered for passthrough. With
	// devicemodel.VFIOBeside and an API server without partitionable
	// devices, no VFIO device is published (see --vfio=only). Empty
	// (--vfio=off) offers none: sysfs is read only to name the GPUs the
	// node's set-up bound to a VFIO driver, which are left out, and to
	// give back the GPUs of earlier claims' records.
	Mode devicemodel.VFIOMode
	// FS is sysfs (vfio.Dir of --sysfs-root on a real node).
	FS vfio.FS
	// Busy tells who holds a GPU; Prepare refuses a GPU in use.
	Busy vfio.BusyChecker
	// Modules loads the VFIO driver's module.
	Modules vfio.ModuleLoader
	// GPUDriver is the VFIO driver GPUs are bound to: vfio.VFIOPCI, or
	// vfio.NVGraceGPUVFIOPCI on Grace systems. Empty means detected from
	// sysfs ([vfio.DetectGPUDriver]): nvgrace-gpu-vfio-pci when the node's
	// GPUs are Grace GPUs (GH200, GB200), vfio-pci otherwise.
	GPUDriver string
	// GPUs, if not empty, are the minors of the GPUs offered for
	// passthrough; the others are not.
	GPUs []int
}

// ModelOption is the device-model option that offers the GPUs of c for
// passthrough: those with an IOMMU group in sysfs (and among GPUs, if
// set), with their PCI IDs and group.
func (c *Config) ModelOption() devicemodel.Option {
	return devicemodel.WithVFIO(c.Mode, func(gpu hardware.GPU) (devicemodel.VFIOInfo, bool) {
		if len(c.GPUs) > 0 && !slices.Contains(c.GPUs, gpu.Minor) {
			return devicemodel.VFIOInfo{}, false
		}
		if !vfio.ValidBusID(gpu.PCIBusID) {
			return devicemodel.VFIOInfo{}, false
		}
		pci, err := vfio.ReadPCIDevice(c.FS, gpu.PCIBusID)
		if err != nil || pci.IOMMUGroup == nil {
			// IOMMU off or the function unknown to sysfs: no passthrough.
			return devicemodel.VFIOInfo{}, false
		}
		return devicemodel.VFIOInfo{VendorID: "0x" + pci.VendorID, DeviceID: "0x" + pci.DeviceID, IOMMUGroup: *pci.IOMMUGroup}, true
	})
}

// Configurator passes GPUs through.
type Configurator struct {
	cfg    *Config
	binder *vfio.Binder
	// driver is the VFIO driver GPUs are bound to (cfg.GPUDriver or the
	// detected one).
	driver string
	// beside says whether VFIO devices are published beside CUDA devices
	// now (it stops when the API server lacks partitionable devices).
	beside atomic.Bool
}

var (
	_ preparer.Feature[Record]         = &Configurator{}
	_ preparer.FeatureEditor[Record]   = &Configurator{}
	_ preparer.Publisher               = &Configurator{}
	_ preparer.FallbackProvider        = &Configurator{}
	_ preparer.FeatureMetadata[Record] = &Configurator{}
)

// New returns the configurator; cfg nil means this node passes nothing
// through (claims for VFIO devices are refused, records of earlier ones
// cannot be undone and say so). One per process: sysfs writes that
// outlive a cancelled call are tracked by its binder.
func New(cfg *Config) (*Configurator, error) {
	c := &Configurator{cfg: cfg}
	if cfg == nil {
		return c, nil
	}
	driver := cfg.GPUDriver
	if driver == "" {
		detected, err := vfio.DetectGPUDriver(cfg.FS)
		if err != nil {
			return nil, fmt.Errorf("VFIO: %w", err)
		}
		driver = detected
		klog.Background().V(1).Info("VFIO driver detected from the GPUs' PCI device IDs", "driver", driver)
	}
	c.driver = driver
	b, err := vfio.NewBinder(cfg.FS, cfg.Busy, cfg.Modules, vfio.WithGPUDriver(driver))
	if err != nil {
		return nil, fmt.Errorf("VFIO: %w", err)
	}
	c.binder = b
	c.beside.Store(cfg.Mode == devicemodel.VFIOBeside)
	return c, nil
}

// Name implements [preparer.Feature].
func (c *Configurator) Name() string { return Name }

// Plan implements [preparer.Feature]: it records, for each VFIO
// device, what binding its IOMMU group changes. It reads sysfs only.
func (c *Configurator) Plan(_ context.Context, cl *preparer.Claim) (*Record, error) {
	var rec Record
	for _, d := range cl.Devices {
		if d.Model.Kind != devicemodel.KindVFIO || slices.ContainsFunc(rec.Devices, func(p Passthrough) bool { return p.Device == d.Model.Name() }) {
			continue
		}
		name := d.Model.Name()
		if c.binder == nil || c.cfg.Mode == "" {
			return nil, fmt.Errorf("device %s: this node does not pass GPUs through (no --vfio)", name)
		}
		planned, err := c.binder.Plan(d.Model.GPU.PCIBusID)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", name, err)
		}
		if setUp := d.Model.GPU.VFIODriver; setUp != "" {
			// Bound by the node's set-up: it stays on its VFIO drivers,
			// and Undo gives it back to them, never to nvidia.
			for i := range planned.Functions {
				if f := &planned.Functions[i]; isVFIODriver(f.OriginalDriver) {
					f.Driver = f.OriginalDriver
				}
			}
			gpu := d.Model.GPU
			rec.Devices = append(rec.Devices, Passthrough{Device: name, Record: planned, GPUInfo: &gpu})
			continue
		}
		// A function on a VFIO driver already is not in the state to plan
		// from: its "original" driver would be the VFIO driver, and the GPU
		// would never be given back. Some record, or someone else, holds it.
		for _, f := range planned.Functions {
			if isVFIODriver(f.OriginalDriver) || isVFIODriver(f.OriginalDriverOverride) {
				return nil, fmt.Errorf("device %s: PCI function %s of GPU %s is bound to %s (driver_override %q) already: another claim holds it, or a passthrough was not undone (after a lost checkpoint, give it back by hand: clear driver_override and bind it to nvidia)",
					name, f.BusID, planned.GPU, f.OriginalDriver, f.OriginalDriverOverride)
			}
		}
		gpu := d.Model.GPU
		rec.Devices = append(rec.Devices, Passthrough{Device: name, Record: planned, GPUInfo: &gpu})
	}
	if len(rec.Devices) == 0 {
		return nil, nil
	}
	return &rec, nil
}

// Apply implements [preparer.Feature]: it binds the IOMMU groups and
// gives each VFIO device its device nodes.
func (c *Configurator) Apply(ctx context.Context, cl *preparer.Claim, rec *Record) (*Record, error) {
	if c.binder == nil {
		return nil, errors.New("this node does not pass GPUs through (no --vfio)")
	}
	for i := range rec.Devices {
		p := &rec.Devices[i]
		if err := c.binder.Bind(ctx, p.Record); err != nil {
			return nil, fmt.Errorf("device %s: pass GPU %s through: %w", p.Device, p.GPU, err)
		}
	}
	if err := c.Edits(ctx, cl, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// Edits implements [preparer.FeatureEditor]: the VFIO device nodes of each
// passed-through GPU, as the device's VfioDeviceConfig asks.
func (c *Configurator) Edits(_ context.Context, cl *preparer.Claim, rec *Record) error {
	if c.cfg == nil {
		return errors.New("this node does not pass GPUs through (no --vfio)")
	}
	for i := range rec.Devices {
		p := &rec.Devices[i]
		for _, d := range cl.Devices {
			if d.Model.Name() != p.Device {
				continue
			}
			opts := vfio.NodeOptions{APIDevice: true}
			if vc, ok := d.Config.Config.(*v1beta1.VfioDeviceConfig); ok {
				opts = vfio.NodeOptions{PreferIOMMUFD: vc.IOMMU.PreferIOMMUFD(), APIDevice: vc.IOMMU.APIDevice()}
			}
			nodes, err := vfio.DeviceNodes(c.cfg.FS, p.Record, opts)
			if err != nil {
				return fmt.Errorf("device %s: %w", p.Device, err)
			}
			edits := &cdispec.ContainerEdits{}
			p.DevicePaths = p.DevicePaths[:0]
			for _, n := range nodes.DeviceNodes {
				edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor})
				p.DevicePaths = append(p.DevicePaths, n.Path)
			}
			d.AddEdits(edits)
		}
	}
	return nil
}

// Undo implements [preparer.Feature]: it gives the IOMMU groups back
// to their drivers. Idempotent, and safe on groups never bound.
func (c *Configurator) Undo(ctx context.Context, _ string, rec *Record) error {
	var errs []error
	for i := range rec.Devices {
		p := &rec.Devices[i]
		if c.binder == nil {
			errs = append(errs, fmt.Errorf("device %s: GPU %s was passed through, but this node does not pass GPUs through now (no --vfio); give it back by hand or run the plugin with --vfio", p.Device, p.GPU))
			continue
		}
		if err := c.binder.Restore(ctx, p.Record); err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", p.Device, err))
		}
	}
	return errors.Join(errs...)
}

// Publish implements [preparer.Publisher]. It offers the GPUs for
// passthrough, and puts back into a new inventory the GPUs that claims
// hold passed through: NVML stops listing a GPU once it is bound to
// vfio-pci, but its devices must stay published while the claim holds it
// (its VFIO device is allocated, and its counters keep the GPU's other
// devices from being allocated) until Unprepare gives it back. The GPU is
// put back as the previous publication saw it or, after a restart, as the
// claim's record describes it; only a record written by an older plugin,
// which lacks the description, leaves the GPU out until it is restored,
// with a notice. GPUs the node's set-up bound to a VFIO driver before the
// plugin started are offered as VFIO devices only, or, where passthrough
// is not offered, left out with a notice; see addSetUpBound.
func (c *Configurator) Publish(in *preparer.PublishInput) {
	if c.cfg == nil {
		return
	}
	offered := c.cfg.Mode != "" && (c.cfg.Mode != devicemodel.VFIOBeside || c.beside.Load())
	if offered {
		in.Options = append(in.Options, c.cfg.ModelOption())
	}
	if in.State == nil {
		// Without the records, a GPU gpudra passed through cannot be told
		// from one the node's set-up did.
		return
	}
	c.keepPassedThrough(in)
	c.addSetUpBound(in, offered)
}

// keepPassedThrough puts back into the inventory the GPUs that claims'
// records hold passed through and NVML no longer lists.
func (c *Configurator) keepPassedThrough(in *preparer.PublishInput) {
	listed := func(uuid string) bool {
		return slices.ContainsFunc(in.Inventory.GPUs, func(n hardware.GPU) bool { return n.UUID == uuid })
	}
	var missing []hardware.GPU
	var undescribed []string
	for _, uid := range slices.Sorted(maps.Keys(in.State.Claims)) {
		cl := in.State.Claims[uid]
		raw := cl.Records[Name]
		if raw == nil {
			continue
		}
		var rec Record
		if err := json.Unmarshal(raw, &rec); err != nil {
			continue // Undo reports a record it cannot read
		}
		for _, p := range rec.Devices {
			uuid := ""
			for _, d := range cl.Devices {
				if d.Name == p.Device {
					uuid = d.UUID
				}
			}
			if uuid == "" || listed(uuid) || slices.ContainsFunc(missing, func(g hardware.GPU) bool { return g.UUID == uuid }) {
				continue
			}
			var prev *hardware.GPU
			if in.Previous != nil {
				if i := slices.IndexFunc(in.Previous.GPUs, func(g hardware.GPU) bool { return g.UUID == uuid }); i >= 0 {
					prev = &in.Previous.GPUs[i]
				}
			}
			switch {
			case prev != nil:
				missing = append(missing, *prev)
			case p.GPUInfo != nil && p.GPUInfo.UUID == uuid:
				missing = append(missing, *p.GPUInfo)
			default:
				undescribed = append(undescribed, fmt.Sprintf("GPU %s (%s, device %s of claim %s)", p.GPU, uuid, p.Device, uid))
			}
		}
	}
	if len(undescribed) > 0 {
		in.Notices = append(in.Notices, preparer.Notice{
			Reason:  "VFIOGPUNotPublished",
			Message: "passed through by an older plugin whose record does not describe it, so it is not published until Unprepare gives it back: " + strings.Join(undescribed, "; "),
		})
	}
	if len(missing) == 0 {
		return
	}
	out := *in.Inventory
	out.GPUs = append(slices.Clone(in.Inventory.GPUs), missing...)
	slices.SortStableFunc(out.GPUs, func(a, b hardware.GPU) int { return a.Index - b.Index })
	in.Inventory = &out
	klog.Background().V(2).Info("Keeping GPUs passed through with VFIO, which discovery no longer lists", "gpus", len(missing))
}

// addSetUpBound adds to the inventory the GPUs that the node's set-up
// bound to a VFIO driver before the plugin started (NVML does not list
// them; sysfs does), when offered, and otherwise names them in a notice.
// GPUs that a claim's record holds passed through are gpudra's own, and
// Publish puts them back as they were. None is ever rebound to nvidia.
func (c *Configurator) addSetUpBound(in *preparer.PublishInput, offered bool) {
	gpus, err := vfio.GPUs(c.cfg.FS)
	if err != nil {
		in.Notices = append(in.Notices, preparer.Notice{
			Reason:  ReasonGPUsBoundToVFIO,
			Message: "cannot tell which GPUs the node's set-up bound to a VFIO driver: " + err.Error(),
		})
		return
	}
	recorded := recordedBusIDs(in.State)
	var found []hardware.GPU
	var lines []string
	for pos, g := range gpus {
		if !isVFIODriver(g.Driver) || recorded[g.BusID] ||
			slices.ContainsFunc(in.Inventory.GPUs, func(n hardware.GPU) bool { return n.PCIBusID == g.BusID }) {
			continue
		}
		line := fmt.Sprintf("GPU %s (PCI device 10de:%s) on %s", g.BusID, g.DeviceID, g.Driver)
		switch {
		case !offered:
			lines = append(lines, line)
		case slices.ContainsFunc(in.Inventory.GPUs, func(n hardware.GPU) bool { return n.Minor == pos }):
			lines = append(lines, line+fmt.Sprintf(" (its device name %s would be another GPU's)", devicemodel.VFIOName(pos)))
		default:
			found = append(found, hardware.GPU{Index: pos, Minor: pos, PCIBusID: g.BusID, VFIODriver: g.Driver})
		}
	}
	if len(lines) > 0 {
		msg := "bound to a VFIO driver by the node's set-up, so NVML does not list them; not published, and not rebound to nvidia: " + strings.Join(lines, "; ")
		if c.cfg.Mode == "" {
			msg += " (run the plugin with --vfio=beside or --vfio=only to offer them for passthrough)"
		}
		in.Notices = append(in.Notices, preparer.Notice{Reason: ReasonGPUsBoundToVFIO, Message: msg, Expected: true})
	}
	if len(found) == 0 {
		return
	}
	out := *in.Inventory
	out.GPUs = append(slices.Clone(in.Inventory.GPUs), found...)
	in.Inventory = &out
}

// ReasonGPUsBoundToVFIO is the reason of the notice (and Node event) that
// names the GPUs the node's set-up bound to a VFIO driver which are not
// published.
const ReasonGPUsBoundToVFIO = "GPUsBoundToVFIO"

// recordedBusIDs returns the bus IDs of the GPUs that claims' records hold
// passed through.
func recordedBusIDs(state *claimstate.State) map[string]bool {
	out := map[string]bool{}
	for _, cl := range state.Claims {
		var rec Record
		if raw := cl.Records[Name]; raw == nil || json.Unmarshal(raw, &rec) != nil {
			continue
		}
		for _, p := range rec.Devices {
			if p.GPUInfo == nil || p.GPUInfo.VFIODriver == "" {
				out[p.GPU] = true
			}
		}
	}
	return out
}

// Fallbacks implements [preparer.FallbackProvider].
func (c *Configurator) Fallbacks() []preparer.Fallback {
	if c.cfg == nil || c.cfg.Mode != devicemodel.VFIOBeside {
		return nil
	}
	return []preparer.Fallback{{
		Feature: "DRAPartitionableDevices", On: &c.beside,
		Log:    "The API server lacks partitionable devices (DRAPartitionableDevices): VFIO devices are no longer published beside the CUDA devices; run with --vfio=only to offer GPUs for passthrough without shared counters",
		Reason: "VFIOUnavailable",
		Event:  "The API server dropped the shared counters that keep VFIO and CUDA devices of one GPU apart (DRAPartitionableDevices off): gpudra stops publishing VFIO devices; --vfio=only offers GPUs for passthrough without counters",
	}}
}

// GPUDriver returns the VFIO driver GPUs are bound to: the configured
// one, or the one detected from sysfs; "" when the node passes nothing
// through.
func (c *Configurator) GPUDriver() string { return c.driver }

func isVFIODriver(name string) bool { return vfio.IsVFIODriver(name) }
