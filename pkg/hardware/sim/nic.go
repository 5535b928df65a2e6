package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// NIC is one simulated RDMA network adapter of a node. gpudra does not
// serve NICs: the local cluster's simulated NIC driver publishes them, so
// that claims can pair a GPU with a NIC under one PCIe root. After
// [Resolve] every optional field holds its effective value.
type NIC struct {
	// Model is a key of the NIC model table, see [NICModelNames].
	Model string `json:"model"`
	// PCIeRoot is the root complex the adapter sits under, "pci0000:15";
	// required, since pairing with a GPU is what a NIC is simulated for.
	PCIeRoot string `json:"pcieRoot"`
	// LinkType is the port's link layer: "infiniband" (the default) or
	// "ethernet" (RoCE).
	LinkType string `json:"linkType,omitempty"`
	// SpeedGbps is the port's speed in Gb/s; the default is the model's.
	SpeedGbps int `json:"speedGbps,omitempty"`
	// PCIBusID in extended BDF form, "0000:18:00.0"; empty if unknown.
	PCIBusID string `json:"pciBusID,omitempty"`
	// NUMANode is the NUMA node; -1 means no NUMA affinity. The default is
	// that of the first GPU under the same PCIe root, or else -1.
	NUMANode *int `json:"numaNode,omitempty"`
}

// Link types of a NIC ([NIC.LinkType]).
const (
	LinkInfiniBand = "infiniband"
	LinkEthernet   = "ethernet"
)

// NICModel describes one simulated NIC model.
type NICModel struct {
	// Name is the fleet file's model name.
	Name string
	// SpeedGbps is the fastest port speed the model's usual cards have.
	SpeedGbps int
}

// nicModels are NVIDIA's RDMA adapters in GPU servers, with the port speed
// of their top cards (ConnectX-6 HDR 200, ConnectX-7 NDR 400, ConnectX-8
// XDR 800, BlueField-3 400 Gb/s). Every one runs InfiniBand or Ethernet.
var nicModels = map[string]NICModel{
	"ConnectX-6":  {Name: "ConnectX-6", SpeedGbps: 200},
	"ConnectX-7":  {Name: "ConnectX-7", SpeedGbps: 400},
	"ConnectX-8":  {Name: "ConnectX-8", SpeedGbps: 800},
	"BlueField-3": {Name: "BlueField-3", SpeedGbps: 400},
}

// NICModelNames returns the names of the simulated NIC models, sorted.
func NICModelNames() []string {
	return slices.Sorted(maps.Keys(nicModels))
}

// resolveNICs fills in the defaults of the node's NICs and reports what is
// wrong with them. busIDs holds the bus IDs of the node's GPUs by index,
// which no NIC may reuse.
func (n *Node) resolveNICs(p *problems, busIDs map[string]int) {
	nicBusIDs := map[string]int{}
	for i := range n.NICs {
		c := &n.NICs[i]
		field := fmt.Sprintf("nics[%d]", i)
		m, ok := nicModels[c.Model]
		switch {
		case c.Model == "":
			p.add(field+".model", "must be set (known models: %s)", strings.Join(NICModelNames(), ", "))
		case !ok:
			p.add(field+".model", "unknown model %q (known models: %s)", c.Model, strings.Join(NICModelNames(), ", "))
		}
		switch {
		case c.PCIeRoot == "":
			p.add(field+".pcieRoot", "must be set, like \"pci0000:15\" (the root of the GPUs the NIC pairs with)")
		case !patterns().pcieRoot.MatchString(c.PCIeRoot):
			p.add(field+".pcieRoot", "%q is not a PCIe root like \"pci0000:15\"", c.PCIeRoot)
		}
		switch c.LinkType {
		case "":
			c.LinkType = LinkInfiniBand
		case LinkInfiniBand, LinkEthernet:
		default:
			p.add(field+".linkType", "%q: must be %s or %s", c.LinkType, LinkInfiniBand, LinkEthernet)
		}
		switch {
		case c.SpeedGbps == 0 && ok:
			c.SpeedGbps = m.SpeedGbps
		case c.SpeedGbps < 0:
			p.add(field+".speedGbps", "%d: must be a positive speed in Gb/s", c.SpeedGbps)
		}
		if c.PCIBusID != "" {
			c.PCIBusID = strings.ToLower(c.PCIBusID)
			if !patterns().busID.MatchString(c.PCIBusID) {
				p.add(field+".pciBusID", "%q is not an extended BDF like \"0000:18:00.0\"", c.PCIBusID)
			} else if j, dup := busIDs[c.PCIBusID]; dup {
				p.add(field+".pciBusID", "%s is also the bus ID of gpus[%d]", c.PCIBusID, j)
			} else if j, dup := nicBusIDs[c.PCIBusID]; dup {
				p.add(field+".pciBusID", "%s is also the bus ID of nics[%d]", c.PCIBusID, j)
			}
			nicBusIDs[c.PCIBusID] = i
		}
		if c.NUMANode == nil {
			numa := n.rootNUMANode(c.PCIeRoot)
			c.NUMANode = &numa
		} else if *c.NUMANode < -1 {
			p.add(field+".numaNode", "%d is not a NUMA node (-1 for none)", *c.NUMANode)
		}
	}
}

// rootNUMANode returns the NUMA node of the first GPU under root, -1 if
// none is: a device shares its root complex's NUMA node.
func (n *Node) rootNUMANode(root string) int {
	for _, g := range n.GPUs {
		if g.PCIeRoot == root && g.NUMANode != nil {
			return *g.NUMANode
		}
	}
	return -1
}
