package draplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// withVFIO runs the plugin with passthrough over the node's fake sysfs.
func withVFIO(tb testing.TB, mode devicemodel.VFIOMode, fake **fakesysfs.Sysfs) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		tb.Helper()
		fleet, err := simfleet.Load("dgx-h100")
		if err != nil {
			tb.Fatal(err)
		}
		n, err := fleet.Node(nodeName)
		if err != nil {
			tb.Fatal(err)
		}
		s, err := n.Sysfs()
		if err != nil {
			tb.Fatal(err)
		}
		*fake = s
		cfg.VFIO = &draplugin.VFIOConfig{Mode: mode, FS: s, Busy: s, Modules: s}
	}
}

func (h *harness) device(name string) resourceapi.Device {
	h.tb.Helper()
	for _, d := range h.driver.Devices() {
		if d.Name == name {
			return d
		}
	}
	h.tb.Fatalf("no device %s", name)
	return resourceapi.Device{}
}

func TestVFIODevicesBesideCUDA(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake))
	v := h.device("gpu-vfio-3")
	if got := *v.Attributes[devicemodel.AttrType].StringValue; got != "vfio" {
		t.Errorf("type %q, want vfio", got)
	}
	if got := *v.Attributes[devicemodel.AttrVendorID].StringValue; got != "0x10de" {
		t.Errorf("vendorID %q", got)
	}
	if g := v.Attributes[devicemodel.AttrIOMMUGroup].IntValue; g == nil || *g != 23 {
		t.Errorf("iommuGroup %v, want 23", g)
	}
	full := h.device("gpu-3")
	if len(v.ConsumesCounters) != 1 || len(full.ConsumesCounters) != 1 || v.ConsumesCounters[0].CounterSet != full.ConsumesCounters[0].CounterSet {
		t.Fatalf("VFIO device consumes %v, full GPU %v: want the same whole counter set", v.ConsumesCounters, full.ConsumesCounters)
	}

	bdf := *v.Attributes["resource.kubernetes.io/pciBusID"].StringValue
	claim := h.claim("gpu-vfio-3")
	h.mustPrepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "vfio-pci" {
		t.Errorf("after prepare GPU %s is bound to %q, want vfio-pci", bdf, b.Driver)
	}
	spec := h.specContent(claim)
	for _, want := range []string{"/dev/vfio/23", "/dev/vfio/vfio"} {
		if !strings.Contains(spec, want) {
			t.Errorf("CDI spec lacks %s:\n%s", want, spec)
		}
	}
	for _, not := range []string{"/dev/nvidia3", "/dev/nvidiactl"} {
		if strings.Contains(spec, not) {
			t.Errorf("VFIO claim's CDI spec has NVIDIA driver node %s:\n%s", not, spec)
		}
	}
	if cp := h.checkpoint(); !strings.Contains(cp, `"vfio":{"devices":[{"device":"`) || !strings.Contains(cp, `"gpu":"`+bdf+`"`) || !strings.HasPrefix(cp, `{"version":"v5"`) {
		t.Errorf("checkpoint lacks the VFIO record: %s", cp)
	}

	// The driver is the last guard: the full GPU cannot go to another claim.
	if msg := prepareError(h, h.claim("gpu-3")); !strings.Contains(msg, "already prepared for claim") {
		t.Errorf("full GPU while passed through: %q, want a conflict", msg)
	}

	h.restart() // the record survives; unprepare still gives the GPU back
	h.mustUnprepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("after unprepare GPU %s: %+v, want nvidia with no override", bdf, b)
	}
	h.mustPrepare(h.claim("gpu-3"))
}

func TestVFIOIOMMUFDAndRefusals(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake))
	bdf := *h.device("gpu-vfio-5").Attributes["resource.kubernetes.io/pciBusID"].StringValue

	fd := h.claim("gpu-vfio-5")
	withConfig(fd, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig","iommu":{"backendPolicy":"PreferIommuFD","enableAPIDevice":true}}`)
	fd = h.update(fd)
	h.mustPrepare(fd)
	spec := h.specContent(fd)
	if !strings.Contains(spec, "/dev/iommu") || !strings.Contains(spec, "/dev/vfio/devices/vfio") || strings.Contains(spec, "/dev/vfio/vfio") {
		t.Errorf("iommufd claim's CDI spec:\n%s\nwant /dev/iommu and /dev/vfio/devices/vfioN, not the legacy container", spec)
	}
	h.mustUnprepare(fd)

	// A GPU in use is refused and left as it was.
	if err := fake.SetHolders(bdf, "python (pid 4242)"); err != nil {
		t.Fatal(err)
	}
	busy := h.claim("gpu-vfio-5")
	if msg := prepareError(h, busy); !strings.Contains(msg, "in use by python (pid 4242)") {
		t.Errorf("busy GPU: %q, want the holder named", msg)
	}
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" {
		t.Errorf("busy GPU rebound to %q", b.Driver)
	}
	if err := fake.SetHolders(bdf); err != nil {
		t.Fatal(err)
	}

	// A bind that fails midway is rolled back.
	fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpWrite, Path: "bus/pci/drivers/vfio-pci/bind", Err: syscall.EIO, Times: 1})
	if msg := prepareError(h, busy); !strings.Contains(msg, "input/output error") {
		t.Errorf("failed bind: %q, want the sysfs error", msg)
	}
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("after a failed bind GPU is %+v, want nvidia again", b)
	}
	if cp := h.checkpoint(); strings.Contains(cp, string(busy.ObjectMeta.UID)) {
		t.Errorf("failed bind left a record: %s", cp)
	}
	h.mustPrepare(busy) // the fault wore off
	h.mustUnprepare(busy)
}

func TestVFIOOnly(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOOnly, &fake))
	for _, d := range h.driver.Devices() {
		if strings.HasPrefix(d.Name, "gpu-") && !strings.HasPrefix(d.Name, "gpu-vfio-") {
			t.Errorf("device %s published in VFIO-only mode", d.Name)
		}
		if len(d.ConsumesCounters) != 0 {
			t.Errorf("device %s consumes counters in VFIO-only mode", d.Name)
		}
	}
	if len(h.driver.Devices()) != 8 {
		t.Errorf("%d devices, want 8 VFIO devices", len(h.driver.Devices()))
	}
}

// nvmlHidesVFIO is the node's hardware as NVML sees it: a GPU bound to
// vfio-pci is not listed.
type nvmlHidesVFIO struct {
	hardware.Hardware
	sysfs *fakesysfs.Sysfs
}

func (h nvmlHidesVFIO) Discover(ctx context.Context) (*hardware.Inventory, error) {
	inv, err := h.Hardware.Discover(ctx)
	if err != nil {
		return nil, err
	}
	out := *inv
	out.GPUs = slices.DeleteFunc(slices.Clone(inv.GPUs), func(g hardware.GPU) bool {
		b, _ := h.sysfs.Binding(g.PCIBusID)
		return b.Driver == "vfio-pci"
	})
	return &out, nil
}

func TestVFIOGPUStaysPublishedWhileNVMLCannotSeeIt(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake), func(c *draplugin.Config) {
		c.Hardware = nvmlHidesVFIO{Hardware: c.Hardware, sysfs: fake}
		c.DiscoveryInterval = 20 * time.Millisecond
	})
	claim := h.claim("gpu-vfio-3")
	h.mustPrepare(claim)
	inv, err := h.cfg.Hardware.Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 7 {
		t.Fatalf("NVML lists %d GPUs while one is passed through, want 7: the test would check nothing", len(inv.GPUs))
	}
	time.Sleep(200 * time.Millisecond) // several discoveries
	for _, name := range []string{"gpu-3", "gpu-vfio-3"} {
		if !slices.ContainsFunc(h.driver.Devices(), func(d resourceapi.Device) bool { return d.Name == name }) {
			t.Errorf("%s no longer published while its GPU is passed through", name)
		}
	}
	h.mustUnprepare(claim)
	time.Sleep(100 * time.Millisecond)
	if n := len(h.driver.Devices()); n != 16 {
		t.Errorf("%d devices after the GPU came back, want 16", n)
	}
}

// TestVFIORestartWhilePassedThrough: a plugin restarted while one of its
// passthroughs is in place never saw the GPU through NVML, which no longer
// lists it; it publishes the GPU from the claim's record (the full GPU and
// its VFIO device, so nothing else is allocated on it), and Unprepare
// gives the GPU back to nvidia.
func TestVFIORestartWhilePassedThrough(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake), func(c *draplugin.Config) {
		c.Hardware = nvmlHidesVFIO{Hardware: c.Hardware, sysfs: fake}
	})
	want := h.device("gpu-vfio-3")
	bdf := *want.Attributes["resource.kubernetes.io/pciBusID"].StringValue
	claim := h.claim("gpu-vfio-3")
	h.mustPrepare(claim)
	h.restart()
	inv, err := h.cfg.Hardware.Discover(t.Context())
	if err != nil || len(inv.GPUs) != 7 {
		t.Fatalf("NVML lists %d GPUs after the restart (%v), want 7: the test would check nothing", len(inv.GPUs), err)
	}
	if n := len(h.driver.Devices()); n != 16 {
		t.Errorf("%d devices after the restart, want 16: the passed-through GPU is published from its record", n)
	}
	got := h.device("gpu-vfio-3")
	if *got.Attributes["uuid"].StringValue != *want.Attributes["uuid"].StringValue || len(got.ConsumesCounters) != 1 {
		t.Errorf("after the restart gpu-vfio-3 is %+v, want the device published before", got)
	}
	h.device("gpu-3")
	h.mustUnprepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("after unprepare GPU %s: %+v, want nvidia with no override", bdf, b)
	}
}

// TestVFIORetryAfterAFailedRollback: the CDI write fails after the group
// was bound, and giving it back fails too, so the start record stays with
// the group half given back. The kubelet's retry rolls back first and plans
// from the restored state: the record names nvidia as the driver to give
// the GPU back to, and Unprepare does.
func TestVFIORetryAfterAFailedRollback(t *testing.T) {
	var fake *fakesysfs.Sysfs
	var failWrite atomic.Bool
	failWrite.Store(true)
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake), func(c *draplugin.Config) {
		c.Faults = func(s draplugin.Step, _ string) error {
			if s == draplugin.StepWriteCDISpec && failWrite.Load() {
				return errors.New("disk full")
			}
			return nil
		}
	})
	bdf := *h.device("gpu-vfio-4").Attributes["resource.kubernetes.io/pciBusID"].StringValue
	fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpWrite, Path: "bus/pci/drivers/nvidia/bind", Err: syscall.EIO, Times: 1})
	c := h.claim("gpu-vfio-4")
	if msg := prepareError(h, c); !strings.Contains(msg, "disk full") || !strings.Contains(msg, "kept the start record") {
		t.Fatalf("first prepare: %q, want the injected failure and a kept start record", msg)
	}
	if b, _ := fake.Binding(bdf); b.Driver == "nvidia" {
		t.Fatalf("after the failed rollback the GPU is back on nvidia; the test expects it left half done")
	}
	failWrite.Store(false)
	h.mustPrepare(c)
	if cp := h.checkpoint(); !strings.Contains(cp, `"originalDriver":"nvidia"`) || strings.Contains(cp, `"originalDriver":"vfio-pci"`) {
		t.Errorf("retried record: %s, want nvidia as the original driver", cp)
	}
	h.mustUnprepare(c)
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("after unprepare the GPU is %+v, want nvidia with no override", b)
	}
}

// TestVFIOSpecRepairedWhileBound: a prepared VFIO claim whose CDI spec
// went missing gets it back, with the same nodes, while its GPU stays on
// vfio-pci.
func TestVFIOSpecRepairedWhileBound(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake))
	c := h.claim("gpu-vfio-6")
	h.mustPrepare(c)
	before := h.specContent(c)
	for _, f := range h.specFiles() {
		if err := os.Remove(filepath.Join(h.cfg.CDIDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	h.mustPrepare(c)
	if after := h.specContent(c); after != before {
		t.Errorf("repaired spec differs:\n%s\nwant\n%s", after, before)
	}
	h.mustUnprepare(c)
}

// withVFIOOn runs the plugin on a node of a fleet (a built-in one or YAML)
// with passthrough over the node's fake sysfs and the VFIO driver left to
// detection.
func withVFIOOn(tb testing.TB, fleetNameOrYAML, node string, mode devicemodel.VFIOMode, fake **fakesysfs.Sysfs) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		tb.Helper()
		withFleet(tb, fleetNameOrYAML, node)(cfg)
		fleet, err := simfleet.Load(fleetNameOrYAML)
		if err != nil {
			fleet, err = simfleet.Parse([]byte(fleetNameOrYAML), "test")
		}
		if err != nil {
			tb.Fatal(err)
		}
		n, err := fleet.Node(node)
		if err != nil {
			tb.Fatal(err)
		}
		s, err := n.Sysfs()
		if err != nil {
			tb.Fatal(err)
		}
		*fake = s
		cfg.VFIO = &draplugin.VFIOConfig{Mode: mode, FS: s, Busy: s, Modules: s}
	}
}

// TestVFIOGraceDetected: on a GH200 node, without --vfio-driver, a GPU is
// passed through with nvgrace-gpu-vfio-pci (the driver the kernel matches
// GH200's device ID with) and given back to nvidia.
func TestVFIOGraceDetected(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIOOn(t, "gh200-nvl32", "gh200-nvl32-00", devicemodel.VFIOBeside, &fake))
	bdf := *h.device("gpu-vfio-0").Attributes["resource.kubernetes.io/pciBusID"].StringValue
	claim := h.claim("gpu-vfio-0")
	h.mustPrepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "nvgrace-gpu-vfio-pci" {
		t.Errorf("GH200 passed through with %q, want nvgrace-gpu-vfio-pci", b.Driver)
	}
	h.mustUnprepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("after unprepare: %+v, want nvidia with no override", b)
	}
}

// setUpBoundFleet is a node whose set-up bound GPU 2 to vfio-pci before
// the plugin started: NVML lists the other three.
const setUpBoundFleet = `nodes:
- name: h100-vfio
  gpus:
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
    boundTo: vfio-pci
  - model: H100-SXM5-80GB
`

// TestVFIOGPUBoundAtStart: a GPU the node's set-up bound to vfio-pci is
// published as a VFIO device only (no CUDA device, no counters), passed
// through where it is, and left on vfio-pci by Unprepare; without
// passthrough it is left out with a notice. It is never rebound to nvidia.
func TestVFIOGPUBoundAtStart(t *testing.T) {
	t.Run("offered", func(t *testing.T) {
		var fake *fakesysfs.Sysfs
		h := newHarness(t, withVFIOOn(t, setUpBoundFleet, "h100-vfio", devicemodel.VFIOBeside, &fake))
		var names []string
		for _, d := range h.driver.Devices() {
			names = append(names, d.Name)
		}
		slices.Sort(names)
		want := []string{"gpu-0", "gpu-1", "gpu-3", "gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2", "gpu-vfio-3"}
		if !slices.Equal(names, want) {
			t.Fatalf("devices %v, want %v", names, want)
		}
		v := h.device("gpu-vfio-2")
		bdf := *v.Attributes["resource.kubernetes.io/pciBusID"].StringValue
		if b, _ := fake.Binding(bdf); b.Driver != "vfio-pci" {
			t.Fatalf("GPU %s bound to %q at start, want vfio-pci: the test would check nothing", bdf, b.Driver)
		}
		if len(v.ConsumesCounters) != 0 || *v.Attributes[devicemodel.AttrType].StringValue != "vfio" {
			t.Errorf("gpu-vfio-2: %+v, want a VFIO device without counters", v)
		}
		if _, ok := v.Attributes["uuid"]; ok {
			t.Errorf("gpu-vfio-2 has a uuid attribute, which NVML never told")
		}
		claim := h.claim("gpu-vfio-2")
		h.mustPrepare(claim)
		if spec := h.specContent(claim); !strings.Contains(spec, "/dev/vfio/22") {
			t.Errorf("CDI spec lacks the group's node /dev/vfio/22:\n%s", spec)
		}
		h.mustUnprepare(claim)
		if b, _ := fake.Binding(bdf); b.Driver != "vfio-pci" || b.Override != "vfio-pci" {
			t.Errorf("after unprepare GPU %s is %+v, want vfio-pci as the set-up left it", bdf, b)
		}
		h.restart()
		if len(h.driver.Devices()) != len(want) {
			t.Errorf("%d devices after a restart, want %d", len(h.driver.Devices()), len(want))
		}
	})
	t.Run("not offered", func(t *testing.T) {
		var fake *fakesysfs.Sysfs
		h := newHarness(t, withVFIOOn(t, setUpBoundFleet, "h100-vfio", "", &fake))
		var names []string
		for _, d := range h.driver.Devices() {
			names = append(names, d.Name)
		}
		slices.Sort(names)
		if want := []string{"gpu-0", "gpu-1", "gpu-3"}; !slices.Equal(names, want) {
			t.Errorf("devices %v, want %v", names, want)
		}
		logs := h.logs()
		for _, want := range []string{"GPUsBoundToVFIO", "bound to a VFIO driver by the node's set-up", "on vfio-pci", "not rebound to nvidia", "--vfio=beside"} {
			if !strings.Contains(logs, want) {
				t.Errorf("the plugin does not log %q:\n%s", want, logs)
			}
		}
		bound := 0
		for _, b := range fake.Bindings() {
			if b.Driver == "vfio-pci" {
				bound++
			}
		}
		if bound != 1 {
			t.Errorf("%d GPUs on vfio-pci, want the one the set-up bound: %+v", bound, fake.Bindings())
		}
	})
}
