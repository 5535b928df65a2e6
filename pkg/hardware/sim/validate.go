package sim

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// patterns are the fleet file's formats, compiled at first use: only a
// simulating process reads a fleet file.
var patterns = sync.OnceValue(func() *fleetPatterns {
	const uuidBody = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`
	return &fleetPatterns{
		nodeName:      regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`),
		driverVersion: regexp.MustCompile(`^[0-9]+(\.[0-9]+)+$`),
		cudaVersion:   regexp.MustCompile(`^[0-9]+\.[0-9]{1,2}$`),
		gpuUUID:       regexp.MustCompile(`^GPU-` + uuidBody + `$`),
		uuid:          regexp.MustCompile(`^` + uuidBody + `$`),
		migUUID:       regexp.MustCompile(`^MIG-` + uuidBody + `$`),
		busID:         regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`),
		pcieRoot:      regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`),
	}
})

type fleetPatterns struct {
	nodeName, driverVersion, cudaVersion, gpuUUID, uuid, migUUID, busID, pcieRoot *regexp.Regexp
}

// maxMinor is the largest GPU minor; 255 is /dev/nvidiactl.
const maxMinor = 254

// problems collects validation errors, each prefixed with where it is.
type problems struct {
	where string
	errs  []error
}

func (p *problems) add(field, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s%s: %s", p.where, field, fmt.Sprintf(format, args...)))
}

// Resolve fills in the defaults of the nodes of one fleet, given in fleet
// order, and validates them, each alone and all together: names and UUIDs
// are unique across the fleet, as they are in the world. It reports every
// problem, each named by where it is in a fleet file ("nodes[1] (a):
// gpus[0].minor: ..."), so that package simfleet can hand them on as the
// file's.
func Resolve(nodes []*Node) error {
	p := &problems{}
	if len(nodes) == 0 {
		p.add("nodes", "a fleet needs at least one node")
	}
	nodeIndex := map[string]int{}
	gpuUUIDs := map[string]string{}
	migUUIDs := map[string]string{}
	for i, n := range nodes {
		where := NodePlace(i, n.Name)
		np := &problems{where: where + ": "}
		n.resolve(np)
		p.errs = append(p.errs, np.errs...)

		if j, dup := nodeIndex[n.Name]; dup && n.Name != "" {
			p.add(where+": name", "%q is also the name of nodes[%d]", n.Name, j)
		}
		nodeIndex[n.Name] = i
		// UUIDs must be unique across the fleet, as they are in the world.
		for g, gpu := range n.GPUs {
			here := fmt.Sprintf("%s gpus[%d]", where, g)
			if prev, dup := gpuUUIDs[gpu.UUID]; dup && gpu.UUID != "" {
				p.add(fmt.Sprintf("%s.uuid", here), "%s is also the UUID of %s", gpu.UUID, prev)
			}
			gpuUUIDs[gpu.UUID] = here
			for m, mig := range gpu.MIGDevices {
				mhere := fmt.Sprintf("%s.migDevices[%d]", here, m)
				if prev, dup := migUUIDs[mig.UUID]; dup && mig.UUID != "" {
					p.add(fmt.Sprintf("%s.uuid", mhere), "%s is also the UUID of %s", mig.UUID, prev)
				}
				migUUIDs[mig.UUID] = mhere
			}
		}
	}
	return errors.Join(p.errs...)
}

// NodePlace names the node at index i of a fleet, called name, as [Resolve]
// names it in its problems: "nodes[1] (a)", or "nodes[1]" without a name.
// Package simfleet names a node's plugin settings' problems the same way.
func NodePlace(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("nodes[%d]", i)
	}
	return fmt.Sprintf("nodes[%d] (%s)", i, name)
}

// resolve fills in the node's defaults and reports what is wrong with it.
func (n *Node) resolve(p *problems) {
	switch {
	case n.Name == "":
		p.add("name", "must not be empty")
	case len(n.Name) > 253 || !patterns().nodeName.MatchString(n.Name):
		p.add("name", "%q is not a valid Kubernetes node name (lower-case RFC 1123 subdomain)", n.Name)
	}
	if n.DriverVersion == "" {
		n.DriverVersion = DefaultDriverVersion
	} else if !patterns().driverVersion.MatchString(n.DriverVersion) {
		p.add("driverVersion", "%q is not a driver version like %q", n.DriverVersion, DefaultDriverVersion)
	}
	if n.CUDADriverVersion == "" {
		n.CUDADriverVersion = DefaultCUDADriverVersion
	} else if !patterns().cudaVersion.MatchString(n.CUDADriverVersion) {
		p.add("cudaDriverVersion", "%q is not a CUDA version like %q", n.CUDADriverVersion, DefaultCUDADriverVersion)
	}

	n.Topology.resolve(p)
	n.NVMLErrors = resolveNVMLErrors(p, "nvmlErrors", n.NVMLErrors, nil)

	if f := n.Fabric; f != nil {
		if f.ClusterUUID == "" {
			f.ClusterUUID = DefaultClusterUUID
		} else if !patterns().uuid.MatchString(f.ClusterUUID) {
			p.add("fabric.clusterUUID", "%q is not a UUID like %q", f.ClusterUUID, DefaultClusterUUID)
		}
		switch f.State {
		case "":
			f.State = string(hardware.FabricCompleted)
		case string(hardware.FabricNotStarted), string(hardware.FabricInProgress), string(hardware.FabricCompleted):
		default:
			p.add("fabric.state", "%q: must be NotStarted, InProgress or Completed", f.State)
		}
		if f.Status != "" && f.State != string(hardware.FabricCompleted) {
			p.add("fabric.status", "a registration error needs state Completed (NVML reports status only then)")
		}
		if f.CompletesAfter != nil {
			switch {
			case f.State == string(hardware.FabricCompleted):
				p.add("fabric.completesAfter", "needs state NotStarted or InProgress (a registration that has not completed yet)")
			case f.CompletesAfter.Duration <= 0:
				p.add("fabric.completesAfter", "%s: must be a positive duration such as 20s", f.CompletesAfter.Duration)
			}
		}
	}

	minors := map[int]int{}
	busIDs := map[string]int{}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		field := fmt.Sprintf("gpus[%d]", i)
		g.resolve(p, field, n, i)
		if g.Minor != nil {
			if j, dup := minors[*g.Minor]; dup {
				p.add(field+".minor", "%d is also the minor of gpus[%d]", *g.Minor, j)
			}
			minors[*g.Minor] = i
		}
		if g.PCIBusID != "" {
			if j, dup := busIDs[g.PCIBusID]; dup {
				p.add(field+".pciBusID", "%s is also the bus ID of gpus[%d]", g.PCIBusID, j)
			}
			busIDs[g.PCIBusID] = i
		}
	}
	n.resolveNICs(p, busIDs)
}

// resolve fills in the defaults of the GPU at index i of node n and
// reports what is wrong with it.
func (g *GPU) resolve(p *problems, field string, n *Node, i int) {
	node, count := n.Name, len(n.GPUs)
	m, ok := models()[g.Model]
	if !ok {
		if g.Model == "" {
			p.add(field+".model", "must be set (known models: %s)", strings.Join(ModelNames(), ", "))
		} else {
			p.add(field+".model", "unknown model %q (known models: %s)", g.Model, strings.Join(ModelNames(), ", "))
		}
		return
	}
	switch g.BoundTo {
	case "", "vfio-pci", "nvgrace-gpu-vfio-pci":
	default:
		p.add(field+".boundTo", "%q: must be vfio-pci or nvgrace-gpu-vfio-pci", g.BoundTo)
	}
	if g.Minor == nil {
		g.Minor = &i
	} else if *g.Minor < 0 || *g.Minor > maxMinor {
		p.add(field+".minor", "%d is out of range 0..%d", *g.Minor, maxMinor)
	}
	if g.UUID == "" {
		g.UUID = gpuUUID(node, i)
	} else if !patterns().gpuUUID.MatchString(g.UUID) {
		p.add(field+".uuid", "%q is not a GPU UUID like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)", g.UUID)
	}
	if g.PCIBusID == "" {
		g.PCIBusID = m.layout.busID(i)
	} else {
		g.PCIBusID = strings.ToLower(g.PCIBusID)
		if !patterns().busID.MatchString(g.PCIBusID) {
			p.add(field+".pciBusID", "%q is not an extended BDF like \"0000:1b:00.0\"", g.PCIBusID)
		}
	}
	topo := n.Topology
	if topo == nil {
		topo = &Topology{}
	}
	switch {
	case g.PCIeRoot == "" && topo.PCIeRoot == TopologyUnknown:
		g.PCIeRoot = TopologyUnknown
	case g.PCIeRoot == "":
		g.PCIeRoot = m.layout.pcieRoot(i)
	case g.PCIeRoot != TopologyUnknown && !patterns().pcieRoot.MatchString(g.PCIeRoot):
		p.add(field+".pcieRoot", "%q is not a PCIe root like \"pci0000:15\" (or %q)", g.PCIeRoot, TopologyUnknown)
	}
	switch {
	case g.NUMANode == nil && topo.NUMANode == TopologyNone:
		none := -1
		g.NUMANode = &none
	case g.NUMANode == nil:
		numa := m.layout.numaNode(i, count)
		g.NUMANode = &numa
	case *g.NUMANode < -1:
		p.add(field+".numaNode", "%d is not a NUMA node (-1 for none)", *g.NUMANode)
	}
	if g.MemoryMiB == 0 {
		g.MemoryMiB = m.MemoryMiB
	} else if g.MIGEnabled && g.MemoryMiB != m.MemoryMiB {
		// Profile names ("1g.10gb") derive from the total; another total
		// would rename the model's profiles.
		p.add(field+".memoryMiB", "must be the model's %d MiB on a MIG-enabled %s", m.MemoryMiB, m.Name)
	}
	// The model's quirks, then the node's (resolved above), then the GPU's
	// own: the nearer declaration wins.
	base := maps.Clone(m.NVMLErrors)
	if base == nil && len(n.NVMLErrors) > 0 {
		base = map[string]string{}
	}
	maps.Copy(base, n.NVMLErrors)
	g.NVMLErrors = resolveNVMLErrors(p, field+".nvmlErrors", g.NVMLErrors, base)
	g.resolveMIG(p, field, m, node, i)
}

// resolveMIG places the GPU's MIG devices and checks that they fit.
func (g *GPU) resolveMIG(p *problems, field string, m *Model, node string, index int) {
	if len(m.MIGProfiles) == 0 && g.MIGEnabled {
		p.add(field+".migEnabled", "model %s does not support MIG", m.Name)
		return
	}
	if !g.MIGEnabled && len(g.MIGDevices) > 0 {
		p.add(field+".migDevices", "MIG devices need migEnabled: true")
		return
	}
	owner := make([]int, m.MemorySlices) // memory slice -> device index + 1
	// Placement rules also keep the compute slices within budget: on the
	// 8-memory-slice GPUs no set of non-overlapping allowed placements
	// needs more than 7.
	instances := map[string]int{}
	var placed []*MIGProfile
	for j := range g.MIGDevices {
		d := &g.MIGDevices[j]
		dfield := fmt.Sprintf("%s.migDevices[%d]", field, j)
		prof, ok := m.profile(d.Profile)
		if !ok {
			p.add(dfield+".profile", "unknown profile %q for %s (allowed: %s)", d.Profile, m.Name, strings.Join(m.profileNames(), ", "))
			continue
		}
		// conflict returns the device already holding a memory slice of
		// a placement at start, or -1.
		conflict := func(start int) int {
			for s := start; s < start+prof.PlacementSize; s++ {
				if owner[s] != 0 {
					return owner[s] - 1
				}
			}
			return -1
		}
		free := func(start int) bool { return conflict(start) < 0 }
		switch {
		case d.PlacementStart == nil:
			i := slices.IndexFunc(prof.PlacementStarts, free)
			if i < 0 {
				p.add(dfield+".placementStart", "no free placement left for %s (allowed starts: %s)", prof.Name, ints(prof.PlacementStarts))
				continue
			}
			start := prof.PlacementStarts[i]
			d.PlacementStart = &start
		case !slices.Contains(prof.PlacementStarts, *d.PlacementStart):
			p.add(dfield+".placementStart", "%d is not allowed for %s on %s (allowed: %s)", *d.PlacementStart, prof.Name, m.Name, ints(prof.PlacementStarts))
			continue
		case !free(*d.PlacementStart):
			other := conflict(*d.PlacementStart)
			p.add(dfield+".placementStart", "%s at %d (memory slices %d-%d) overlaps migDevices[%d] (%s at %d)",
				prof.Name, *d.PlacementStart, *d.PlacementStart, *d.PlacementStart+prof.PlacementSize-1,
				other, g.MIGDevices[other].Profile, *g.MIGDevices[other].PlacementStart)
			continue
		}
		for s := *d.PlacementStart; s < *d.PlacementStart+prof.PlacementSize; s++ {
			owner[s] = j + 1
		}
		instances[prof.Name]++
		if instances[prof.Name] > prof.Instances {
			p.add(dfield+".profile", "at most %d %s instance(s) fit on a %s", prof.Instances, prof.Name, m.Name)
		}
		placed = append(placed, prof)
		if short := m.engineShortfall(placed); short != "" {
			p.add(dfield+".profile", "%s does not fit beside the MIG devices before it: a %s has too few %s", prof.Name, m.Name, short)
		}
		if d.ComputeSlices == 0 {
			d.ComputeSlices = prof.Slices
		} else if !slices.Contains(prof.computeSlices(), d.ComputeSlices) {
			p.add(dfield+".computeSlices", "%d is not a compute instance size of %s (allowed: %s)", d.ComputeSlices, prof.Name, ints(prof.computeSlices()))
		}
		if d.UUID == "" {
			d.UUID = migUUID(node, index, prof.Name, *d.PlacementStart)
		} else if !patterns().migUUID.MatchString(d.UUID) {
			p.add(dfield+".uuid", "%q is not a MIG UUID like MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)", d.UUID)
		}
	}
}

// ints formats allowed values for error messages.
func ints(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
