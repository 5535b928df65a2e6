package sim

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Model is one GPU product the simulator knows, with the figures NVML
// reports for it.
type Model struct {
	// Name is the key fleet files use, e.g. "H100-SXM5-80GB".
	Name string
	// ProductName is what nvmlDeviceGetName returns.
	ProductName string
	// Architecture and Brand as NVML reports them.
	Architecture nvml.DeviceArchitecture
	Brand        nvml.BrandType
	// CUDA compute capability.
	CCMajor, CCMinor int
	// MemoryMiB is the total memory nvmlDeviceGetMemoryInfo reports (and
	// nvidia-smi prints), which is less than the marketing figure.
	MemoryMiB uint64
	// PCIDeviceID is the combined device/vendor ID NVML reports.
	PCIDeviceID uint32
	// MemorySlices is the number of MIG memory slices; 0 without MIG.
	MemorySlices int
	// MIGProfiles are the GPU instance profiles, in nvidia-smi mig -lgip
	// order. Empty for GPUs without MIG.
	MIGProfiles []MIGProfile
	// NVMLErrors are the NVML functions the model always answers with an
	// error, as a GPU's nvmlErrors in a fleet file name them (GB10's
	// unified memory: nvmlDeviceGetMemoryInfo NOT_SUPPORTED). Fleet files
	// may override them.
	NVMLErrors map[string]string
	// layout places the GPUs of a node made of this model.
	layout *layout
}

// MIGProfile is one GPU instance profile, with the compute instance that
// spans it.
type MIGProfile struct {
	// Name as nvidia-smi shows it, e.g. "1g.10gb+me".
	Name string
	// GIProfile is the NVML_GPU_INSTANCE_PROFILE_* index.
	GIProfile int
	// ID is nvmlGpuInstanceProfileInfo_t.id, the nvidia-smi profile ID.
	ID int
	// CIProfile is the NVML_COMPUTE_INSTANCE_PROFILE_* index of the
	// compute instance spanning the whole GPU instance; its ID equals it.
	CIProfile int
	// Slices is the number of compute slices (the "g" in the name).
	Slices int
	// Instances is how many instances of the profile fit on the GPU.
	Instances int
	// MemoryMiB is the instance's memory (nvmlGpuInstanceProfileInfo_t's
	// memorySizeMB, which is MiB).
	MemoryMiB uint64
	// Engine counts of the instance.
	Multiprocessors, CopyEngines, Decoders, Encoders, JPEGEngines, OFAEngines int
	// PlacementSize is the placement size in memory slices.
	PlacementSize int
	// PlacementStarts are the allowed placement starts, in memory slices.
	PlacementStarts []int
}

// layout is the PCI layout of a model's usual 8-GPU system.
type layout struct {
	// busIDs are the GPUs' buses in NVML index order.
	busIDs []int
	// roots are the root buses of GPU pairs (index/2).
	roots []int
	// numa are the GPUs' NUMA nodes in NVML index order; nil: the first
	// half of a node's GPUs on node 0, the second on node 1.
	numa []int
	// domains are the GPUs' PCI domains in NVML index order; nil: domain
	// 0, and the next domain for each further set of len(busIDs) GPUs.
	domains []int
}

var (
	// DGX A100: nvidia-smi on DGX A100 lists GPUs at 07, 0f, 47, 4e, 87,
	// 90, b7, bd; pairs sit behind one PCIe switch per AMD root complex.
	// Its two AMD EPYC CPUs run NPS4 (eight NUMA nodes of 16 cores), and
	// `nvidia-smi topo -m` shows NUMA affinity 3, 3, 1, 1, 7, 7, 5, 5:
	// NVIDIA/nccl issue #1505 (a DGX A100 40GB: 3, 3, 1, 1, then GPU 4 on
	// cores 112-127, node 7) and #1435 (8x A100 NVLink, all eight).
	dgxA100Layout = &layout{
		busIDs: []int{0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd},
		roots:  []int{0x00, 0x40, 0x80, 0xa0},
		numa:   []int{3, 3, 1, 1, 7, 7, 5, 5},
	}
	// DGX H100 and DGX H200 (same chassis): nvidia-smi lists GPUs at 1b,
	// 43, 52, 61, 9d, c3, d1, df. The pairing into shared roots is the
	// simulator's, so that topology-aware selectors have pairs to match.
	dgxH100Layout = &layout{
		busIDs: []int{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf},
		roots:  []int{0x15, 0x48, 0x97, 0xc7},
	}
	// A GB200 compute tray (one of the 18 of a GB200 NVL72 rack): two Grace
	// CPUs with two GPUs each, every GPU in a PCI domain of its own.
	// nvidia-smi on GB200 trays lists GPU 0 at 00000008:01:00.0 (public
	// nvidia-smi outputs of GB200 NVL72 systems); the domains of GPUs 1 to
	// 3 (0009, 0018, 0019) are those commonly shown for the other three,
	// and the NUMA nodes are the two Grace CPUs'.
	gb200TrayLayout = &layout{
		busIDs:  []int{0x01, 0x01, 0x01, 0x01},
		roots:   []int{0x00, 0x00},
		numa:    []int{0, 0, 1, 1},
		domains: []int{0x0008, 0x0009, 0x0018, 0x0019},
	}
	// A GH200 node (a Grace Hopper superchip, one GPU): nvidia-smi on
	// GH200 480GB hosts lists the GPU at 00000009:01:00.0 (public
	// nvidia-smi and `nvidia-smi -mig 1` outputs of GH200 nodes); its NUMA
	// affinity is the Grace CPU's node 0 (the GPU's own memory shows up as
	// further, CPU-less NUMA nodes, which NVML does not report as its
	// affinity).
	gh200Layout = &layout{
		busIDs:  []int{0x01},
		roots:   []int{0x00},
		numa:    []int{0},
		domains: []int{0x0009},
	}
	// A DGX Spark (one GB10 superchip): nvidia-smi and NVML on DGX Spark
	// list the GPU at 000F:01:00.0 (nvitop pull request #208 and gpud pull
	// request #1170, both from DGX Spark owners); its NUMA node is the one
	// of its CPU.
	gb10Layout = &layout{
		busIDs:  []int{0x01},
		roots:   []int{0x00},
		numa:    []int{0},
		domains: []int{0x000f},
	}
	// A generic PCIe server: cloud VMs (AWS g5 and g4dn, GCP g2) show their
	// GPUs elsewhere (00000000:00:1E.0, 00000000:00:04.0), which fleet
	// files can set with pciBusID.
	genericLayout = &layout{
		busIDs: []int{0x01, 0x21, 0x41, 0x61, 0x81, 0xa1, 0xc1, 0xe1},
		roots:  []int{0x00, 0x40, 0x80, 0xc0},
	}
)

// busID returns the default PCI bus ID of the GPU at index i. Beyond the
// eighth GPU the layout repeats in the next PCI domain.
func (l *layout) busID(i int) string {
	return fmt.Sprintf("%04x:%02x:00.0", l.domain(i), l.busIDs[i%len(l.busIDs)])
}

// domain returns the PCI domain of the GPU at index i.
func (l *layout) domain(i int) int {
	n := len(l.busIDs)
	if l.domains != nil {
		return l.domains[i%n] + i/n*0x100
	}
	return i / n
}

// pcieRoot returns the default PCIe root of the GPU at index i.
func (l *layout) pcieRoot(i int) string {
	n := len(l.busIDs)
	return fmt.Sprintf("pci%04x:%02x", l.domain(i), l.roots[(i%n)/2])
}

// numaNode returns the default NUMA node of the GPU at index i of a node
// with count GPUs.
func (l *layout) numaNode(i, count int) int {
	if l.numa != nil {
		return l.numa[i%len(l.numa)]
	}
	if i >= (count+1)/2 {
		return 1
	}
	return 0
}

// Figures below come from `nvidia-smi mig -lgip` and `-lgipp` outputs on
// the real GPUs (NVIDIA MIG user guide, "Supported MIG Profiles" and
// "Getting Started"; NVIDIA/mig-parted issue #120 for H200; written out
// with their provenance and doubts in testdata/mig, which a test checks
// these tables against) and from the
// memory totals nvidia-smi prints (A100-SXM4-40GB 40960MiB, A100-SXM4-80GB
// 81920MiB, H100 80GB HBM3 81559MiB, GH200 480GB 97871MiB, L40S 46068MiB). nvidia-smi prints
// instance memory in GiB with two decimals; the MiB figures here are those
// values times 1024 (9.75 GiB = 9984 MiB). go-nvml's mock tables disagree
// with real hardware on memory sizes, engine counts and placements; they
// are not used.

// Placements shared by all 8-memory-slice GPUs (A100, H100, H200), and
// those of the 4-memory-slice A30.
var (
	starts1  = []int{0, 1, 2, 3, 4, 5, 6}
	starts2  = []int{0, 2, 4}
	starts2w = []int{0, 2, 4, 6} // 1-compute-slice, 2-memory-slice profiles
	starts4  = []int{0, 4}
	starts0  = []int{0}

	starts1of4 = []int{0, 1, 2, 3}
	starts2of4 = []int{0, 2}
)

// The rows below are, in order: Name, GIProfile, ID, CIProfile, Slices,
// Instances, MemoryMiB, Multiprocessors, CopyEngines, Decoders, Encoders,
// JPEGEngines, OFAEngines, PlacementSize, PlacementStarts; that is
// -lgip's columns (SM, DEC, ENC / CE, JPEG, OFA) and -lgipp's placements.

// ampereProfiles are A100's profiles; only names and memory differ between
// the 40GB and 80GB products.
func ampereProfiles(names [7]string, mem [7]uint64) []MIGProfile {
	return []MIGProfile{
		{names[0], nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 7, mem[0], 14, 1, 0, 0, 0, 0, 1, starts1},
		{names[1], nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 1, mem[1], 14, 1, 1, 0, 1, 1, 1, starts1},
		{names[2], nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 4, mem[2], 14, 1, 1, 0, 0, 0, 2, starts2w},
		{names[3], nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 2, 3, mem[3], 28, 2, 1, 0, 0, 0, 2, starts2},
		{names[4], nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 3, 2, mem[4], 42, 3, 2, 0, 0, 0, 4, starts4},
		{names[5], nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 4, 1, mem[5], 56, 4, 2, 0, 0, 0, 4, starts0},
		{names[6], nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, 7, 1, mem[6], 98, 7, 5, 0, 1, 1, 8, starts0},
	}
}

// hopperProfiles are the profiles of the GH100 die: H100's, H200's and
// GH200's.
func hopperProfiles(names [7]string, mem [7]uint64) []MIGProfile {
	return []MIGProfile{
		{names[0], nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 7, mem[0], 16, 1, 1, 0, 1, 0, 1, starts1},
		{names[1], nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 1, mem[1], 16, 1, 1, 0, 1, 1, 1, starts1},
		{names[2], nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 4, mem[2], 26, 1, 1, 0, 1, 0, 2, starts2w},
		{names[3], nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 2, 3, mem[3], 32, 2, 2, 0, 2, 0, 2, starts2},
		{names[4], nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 3, 2, mem[4], 60, 3, 3, 0, 3, 0, 4, starts4},
		{names[5], nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 4, 1, mem[5], 64, 4, 4, 0, 4, 0, 4, starts0},
		{names[6], nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, 7, 1, mem[6], 132, 8, 7, 0, 7, 1, 8, starts0},
	}
}

// models are the simulated GPU models by name, built at first use: a
// process that simulates nothing (the plugin on a real node) never builds
// them.
var models = sync.OnceValue(func() map[string]*Model {
	return map[string]*Model{
		"A100-SXM4-40GB": {
			Name: "A100-SXM4-40GB", ProductName: "NVIDIA A100-SXM4-40GB",
			Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA, CCMajor: 8, CCMinor: 0,
			MemoryMiB: 40960, PCIDeviceID: 0x20B010DE, MemorySlices: 8, layout: dgxA100Layout,
			// -lgip: 4.75, 4.75, 9.62, 9.62, 19.50, 19.50, 39.25 GiB.
			MIGProfiles: ampereProfiles(
				[7]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
				[7]uint64{4864, 4864, 9856, 9856, 19968, 19968, 40192}),
		},
		"A100-SXM4-80GB": {
			Name: "A100-SXM4-80GB", ProductName: "NVIDIA A100-SXM4-80GB",
			Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA, CCMajor: 8, CCMinor: 0,
			MemoryMiB: 81920, PCIDeviceID: 0x20B210DE, MemorySlices: 8, layout: dgxA100Layout,
			// -lgip: 9.75, 9.75, 19.50, 19.50, 39.25, 39.25, 79.00 GiB.
			MIGProfiles: ampereProfiles(
				[7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
				[7]uint64{9984, 9984, 19968, 19968, 40192, 40192, 80896}),
		},
		"H100-SXM5-80GB": {
			Name: "H100-SXM5-80GB", ProductName: "NVIDIA H100 80GB HBM3",
			Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA, CCMajor: 9, CCMinor: 0,
			MemoryMiB: 81559, PCIDeviceID: 0x233010DE, MemorySlices: 8, layout: dgxH100Layout,
			// -lgip: 9.75, 9.75, 19.62, 19.62, 39.50, 39.50, 79.25 GiB.
			MIGProfiles: hopperProfiles(
				[7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
				[7]uint64{9984, 9984, 20096, 20096, 40448, 40448, 81152}),
		},
		"H200-SXM5-141GB": {
			Name: "H200-SXM5-141GB", ProductName: "NVIDIA H200",
			Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA, CCMajor: 9, CCMinor: 0,
			MemoryMiB: 143771, PCIDeviceID: 0x233510DE, MemorySlices: 8, layout: dgxH100Layout,
			// -lgip: 16.00, 16.00, 32.25, 32.25, 69.50, 69.50, 139.75 GiB.
			MIGProfiles: hopperProfiles(
				[7]string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
				[7]uint64{16384, 16384, 33024, 33024, 71168, 71168, 143104}),
		},
		// H100 NVL (PCIe, 94GB HBM3, sold in NVLink-bridged pairs): nvidia-smi
		// names it "NVIDIA H100 NVL" and reports 95830MiB (public nvidia-smi
		// outputs, bare metal and Azure NC H100 v5 VMs alike); device ID
		// 0x232110DE (mig-parted's default config, "H100 NVL 94GB",
		// NVIDIA/mig-parted pull request #101). Its -lgip is from NVIDIA's
		// own run in NVIDIA/gpu-operator pull request #900, its -lgipp from
		// public runs on H100 NVL (both in testdata/mig/H100-NVL-94GB.txt):
		// H100's SM and engine counts and placements, with more memory.
		"H100-NVL-94GB": {
			Name: "H100-NVL-94GB", ProductName: "NVIDIA H100 NVL",
			Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA, CCMajor: 9, CCMinor: 0,
			MemoryMiB: 95830, PCIDeviceID: 0x232110DE, MemorySlices: 8, layout: genericLayout,
			// -lgip: 10.75, 10.75, 21.62, 21.62, 46.38, 46.38, 93.12 GiB.
			MIGProfiles: hopperProfiles(
				[7]string{"1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"},
				[7]uint64{11008, 11008, 22144, 22144, 47488, 47488, 95360}),
		},
		// The Hopper GPU of a GH200 480GB superchip (GH200 NVL32 and
		// single-superchip nodes), the 96GB HBM3 version: nvidia-smi names it
		// "NVIDIA GH200 480GB" (480GB counts the Grace CPU's LPDDR5X too) and
		// reports 97871MiB, device ID 0x234210DE, architecture Hopper, compute
		// capability 9.0 (public nvidia-smi -q outputs of GH200 480GB nodes;
		// mig-parted's default config lists 0x234210DE as GH200). Its -lgip,
		// with the same SM and engine counts as H100's (the same GH100 die), is
		// from a public `nvidia-smi mig -lgip` run on a GH200 480GB, see
		// testdata/mig/GH200-96GB.txt; its -lgipp placements were not found
		// published and are H100's.
		"GH200-96GB": {
			Name: "GH200-96GB", ProductName: "NVIDIA GH200 480GB",
			Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA, CCMajor: 9, CCMinor: 0,
			MemoryMiB: 97871, PCIDeviceID: 0x234210DE, MemorySlices: 8, layout: gh200Layout,
			// -lgip: 11.00, 11.00, 23.00, 23.00, 46.50, 46.50, 93.00 GiB.
			MIGProfiles: hopperProfiles(
				[7]string{"1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"},
				[7]uint64{11264, 11264, 23552, 23552, 47616, 47616, 95232}),
		},
		// The Blackwell GPU of a GB200 superchip (GB200 NVL72 compute trays):
		// nvidia-smi names it "NVIDIA GB200" and reports 189471MiB (public
		// nvidia-smi outputs of GB200 NVL72 trays; 186 GB HBM3e marketed),
		// compute capability 10.0 (CUDA's table for GB200/B200), PCI device
		// 0x2941 (as pci.ids lists GB200; not checked on hardware here). Its MIG profiles are not entered yet: the
		// simulated GB200 answers that it does not support MIG.
		"GB200": {
			Name: "GB200", ProductName: "NVIDIA GB200",
			Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA, CCMajor: 10, CCMinor: 0,
			MemoryMiB: 189471, PCIDeviceID: 0x294110DE, layout: gb200TrayLayout,
		},
		// The Blackwell GPU of a GB10 superchip (DGX Spark and its OEM
		// versions). Its memory is the 128 GB LPDDR5X the CPU uses too, and
		// NVML answers nvmlDeviceGetMemoryInfo (v1 and v2) with
		// NVML_ERROR_NOT_SUPPORTED: a DGX Spark owner's raw NVML calls on
		// driver 580.173.02 (nvitop pull request #208), and the NVIDIA DRA
		// driver failing on it (kubernetes-sigs/dra-driver-nvidia-gpu issue
		// #1073, driver 595.58.03). nvtop pull request #463 reports a driver
		// answering with the system's total instead; a fleet file's
		// nvmlErrors {nvmlDeviceGetMemoryInfo: SUCCESS} simulates that, and
		// MemoryMiB is then /proc/meminfo's MemTotal on a DGX Spark,
		// 127600748 kB (nvitop #208). nvidia-smi names it "NVIDIA GB10"
		// (same sources); compute capability 12.1 (CUDA's table, sm_121).
		// No MIG (DGX Spark hardware guide). The PCI device ID 0x2E12 is
		// pci.ids' entry for GB10 as recalled here, not checked on hardware.
		"GB10": {
			Name: "GB10", ProductName: "NVIDIA GB10",
			Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA, CCMajor: 12, CCMinor: 1,
			MemoryMiB: 124610, PCIDeviceID: 0x2E1210DE, layout: gb10Layout,
			NVMLErrors: map[string]string{"nvmlDeviceGetMemoryInfo": "ERROR_NOT_SUPPORTED"},
		},
		// A30 24GB (PCIe): nvidia-smi names it "NVIDIA A30" and reports
		// 24576MiB; its -lgip, -lgipp and the memory of its MIG devices (5952
		// and 11968 MiB) are from a public session on an A30 with driver
		// 535.183.01, see testdata/mig/A30-24GB.txt. Device ID 0x20B710DE as
		// mig-parted logs it for an A30 (NVIDIA/mig-parted issue #157).
		// Compute capability 8.0, GA100 (MIG user guide, "Supported GPUs").
		"A30-24GB": {
			Name: "A30-24GB", ProductName: "NVIDIA A30",
			Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA, CCMajor: 8, CCMinor: 0,
			MemoryMiB: 24576, PCIDeviceID: 0x20B710DE, MemorySlices: 4, layout: genericLayout,
			// -lgip: 5.81, 5.81, 11.69, 11.69, 23.44 GiB.
			MIGProfiles: []MIGProfile{
				{"1g.6gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE, 14, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 4, 5952, 14, 1, 1, 0, 0, 0, 1, starts1of4},
				{"1g.6gb+me", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 21, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 1, 1, 5952, 14, 1, 1, 0, 1, 1, 1, starts1of4},
				{"2g.12gb", nvml.GPU_INSTANCE_PROFILE_2_SLICE, 5, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 2, 2, 11968, 28, 2, 2, 0, 0, 0, 2, starts2of4},
				{"2g.12gb+me", nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1, 6, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 2, 1, 11968, 28, 2, 2, 0, 1, 1, 2, starts2of4},
				{"4g.24gb", nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 4, 1, 24000, 56, 4, 4, 0, 1, 1, 4, starts0},
			},
		},
		// Inference GPUs without MIG, as cloud instances carry them. Names and
		// memory totals as nvidia-smi reports them on driver 595.91.07 ("NVIDIA
		// A10G" 23028 MiB, "NVIDIA L4" 23034 MiB, "Tesla T4" 15360 MiB: a
		// public benchmark protocol listing the three); L4's 23034 MiB also in
		// public nvidia-smi outputs on GCP g2 VMs. Compute capabilities from
		// CUDA's table (A10G 8.6, L4 8.9, T4 7.5). Device IDs as pci.ids lists
		// them (A10G 0x2237, L4 0x27B8, T4 0x1EB8), not checked on hardware.
		// Brand: NVIDIA for all three, as recent drivers report data-centre
		// GPUs; older drivers reported T4 as Tesla, not checked here.
		"A10G": {
			Name: "A10G", ProductName: "NVIDIA A10G",
			Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA, CCMajor: 8, CCMinor: 6,
			MemoryMiB: 23028, PCIDeviceID: 0x223710DE, layout: genericLayout,
		},
		"L4": {
			Name: "L4", ProductName: "NVIDIA L4",
			Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA, CCMajor: 8, CCMinor: 9,
			MemoryMiB: 23034, PCIDeviceID: 0x27B810DE, layout: genericLayout,
		},
		"T4": {
			Name: "T4", ProductName: "Tesla T4",
			Architecture: nvml.DEVICE_ARCH_TURING, Brand: nvml.BRAND_NVIDIA, CCMajor: 7, CCMinor: 5,
			MemoryMiB: 15360, PCIDeviceID: 0x1EB810DE, layout: genericLayout,
		},
		// A GPU without MIG, so that fleets can hold one.
		"L40S": {
			Name: "L40S", ProductName: "NVIDIA L40S",
			Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA, CCMajor: 8, CCMinor: 9,
			MemoryMiB: 46068, PCIDeviceID: 0x26B910DE, layout: genericLayout,
		},
	}
})

// ModelNames returns the names of the models fleet files may use, sorted.
func ModelNames() []string {
	names := make([]string, 0, len(models()))
	for name := range models() {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// LookupModel returns a copy of the model with the given name.
func LookupModel(name string) (Model, bool) {
	m, ok := models()[name]
	if !ok {
		return Model{}, false
	}
	c := *m
	c.NVMLErrors = maps.Clone(m.NVMLErrors)
	c.MIGProfiles = slices.Clone(m.MIGProfiles)
	for i := range c.MIGProfiles {
		c.MIGProfiles[i].PlacementStarts = slices.Clone(c.MIGProfiles[i].PlacementStarts)
	}
	return c, true
}

// profile returns the model's MIG profile with the given name.
func (m *Model) profile(name string) (*MIGProfile, bool) {
	for i := range m.MIGProfiles {
		if m.MIGProfiles[i].Name == name {
			return &m.MIGProfiles[i], true
		}
	}
	return nil, false
}

// ciProfileIndex maps the compute slices of a compute instance smaller
// than its GPU instance to its NVML_COMPUTE_INSTANCE_PROFILE_* index (equal
// to its profile ID, the "ID" column of `nvidia-smi mig -lcip`).
var ciProfileIndex = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
}

// computeSlices returns the sizes, in compute slices, that the compute
// instances of a GPU instance of profile p may have, smallest first: the
// profile's own size, and the smaller sizes c with 2c <= slices+1 (1 to 4
// on a 7g instance, 1 and 2 on a 4g or 3g, 1 on a 2g), the rule go-nvlib
// uses to list MIG profiles.
func (p *MIGProfile) computeSlices() []int {
	var sizes []int
	for c := 1; c < p.Slices; c++ {
		if _, ok := ciProfileIndex[c]; ok && 2*c <= p.Slices+1 {
			sizes = append(sizes, c)
		}
	}
	return append(sizes, p.Slices)
}

// ciProfile returns the NVML_COMPUTE_INSTANCE_PROFILE_* index of compute
// instances of c slices in a GPU instance of profile p.
func (p *MIGProfile) ciProfile(c int) int {
	if c == p.Slices {
		return p.CIProfile
	}
	return ciProfileIndex[c]
}

// wholeProfile returns the profile spanning the whole GPU: the one with
// the most compute slices.
func (m *Model) wholeProfile() *MIGProfile {
	var whole *MIGProfile
	for i := range m.MIGProfiles {
		if p := &m.MIGProfiles[i]; whole == nil || p.Slices > whole.Slices {
			whole = p
		}
	}
	return whole
}

// engineShortfall returns the first engine that GPU instances of profiles
// ps would together need more of than the GPU has (its whole profile's
// count), or "" when they fit. NVML refuses such an instance: on A30 the
// 1g.6gb+me and 2g.12gb+me profiles each take the GPU's only JPEG and OFA
// engine. Placements alone keep the 8-memory-slice GPUs within their
// engines; this check matters where they do not.
func (m *Model) engineShortfall(ps []*MIGProfile) string {
	whole := m.wholeProfile()
	var sm, ce, dec, enc, jpeg, ofa int
	for _, p := range ps {
		sm, ce, dec, enc, jpeg, ofa = sm+p.Multiprocessors, ce+p.CopyEngines, dec+p.Decoders, enc+p.Encoders, jpeg+p.JPEGEngines, ofa+p.OFAEngines
	}
	switch {
	case sm > whole.Multiprocessors:
		return "multiprocessors"
	case ce > whole.CopyEngines:
		return "copy engines"
	case dec > whole.Decoders:
		return "decoders"
	case enc > whole.Encoders:
		return "encoders"
	case jpeg > whole.JPEGEngines:
		return "JPEG engines"
	case ofa > whole.OFAEngines:
		return "OFA engines"
	}
	return ""
}

// profileNames lists the model's MIG profile names for error messages.
func (m *Model) profileNames() []string {
	names := make([]string, len(m.MIGProfiles))
	for i, p := range m.MIGProfiles {
		names[i] = p.Name
	}
	return names
}
