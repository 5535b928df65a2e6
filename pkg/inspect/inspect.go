// Package inspect renders what a node's kubelet plugin would publish: a
// device table for people, ResourceSlice objects for kubectl.
package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Formats lists the output formats, the default first.
var Formats = []string{"table", "yaml", "json"}

// Node is one node's discovery result and the devices derived from it.
type Node struct {
	Name      string
	Inventory *hardware.Inventory
	Model     *devicemodel.Model
	// Health is each GPU's condition, read once (nil when the hardware
	// cannot tell); HealthErr says why it could not be read.
	Health    []hardware.GPUCondition
	HealthErr error
	// Notes say what the publication left out or changed and why (the
	// notices the plugin records as Node events), one line each.
	Notes []string
}

// health is the condition of the GPU with the given UUID, as the HEALTH
// column shows it: "-" when the hardware does not check health, "unknown"
// when the check failed or did not list the GPU.
func (n *Node) health(uuid string) string {
	if n.Health == nil && n.HealthErr == nil {
		return "-"
	}
	for _, c := range n.Health {
		if c.UUID == uuid {
			return c.String()
		}
	}
	return "unknown"
}

// Write renders nodes in the given format.
func Write(w io.Writer, format, driverName string, nodes []Node) error {
	switch format {
	case "table":
		return WriteTable(w, nodes)
	case "yaml":
		for _, n := range nodes {
			for _, s := range ResourceSlices(driverName, n) {
				data, err := yaml.Marshal(s)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(w, "---\n%s", data); err != nil {
					return err
				}
			}
		}
		return nil
	case "json":
		list := &metav1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
		for _, n := range nodes {
			for _, s := range ResourceSlices(driverName, n) {
				raw, err := json.Marshal(s)
				if err != nil {
					return err
				}
				list.Items = append(list.Items, runtime.RawExtension{Raw: raw})
			}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	return fmt.Errorf("unknown output format %q: supported values: %s", format, strings.Join(Formats, ", "))
}

// The label on the slices ResourceSlices returns, so that applied ones
// can be found and deleted (kubectl delete resourceslices -l
// app.kubernetes.io/managed-by=gpudra-inspect) before the plugin starts.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "gpudra-inspect"
)

// ResourceSlices returns the slices the node's plugin publishes, as full
// objects. Their names follow the helper's scheme (slice index, driver,
// node) so that applying them looks like what the plugin would create.
func ResourceSlices(driverName string, n Node) []resourceapi.ResourceSlice {
	chunks := n.Model.Slices()
	out := make([]resourceapi.ResourceSlice, len(chunks))
	for i, c := range chunks {
		out[i] = resourceapi.ResourceSlice{
			TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%x-%s-%s", i, driverName, n.Name), Labels: map[string]string{ManagedByLabel: ManagedBy}},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         driverName,
				Pool:           resourceapi.ResourcePool{Name: n.Name, Generation: 1, ResourceSliceCount: int64(len(chunks))},
				NodeName:       &n.Name,
				Devices:        c.Devices,
				SharedCounters: c.SharedCounters,
			},
		}
	}
	return out
}

// WriteTable prints one line per device.
func WriteTable(w io.Writer, nodes []Node) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tDEVICE\tTYPE\tSHARING\tPRODUCT\tMEMORY\tPROFILE\tPCI BUS ID\tPCIE ROOT\tNUMA\tHEALTH\tTAINTS\tUUID")
	for i := range nodes {
		n := &nodes[i]
		if len(n.Model.Devices) == 0 {
			fmt.Fprintf(tw, "%s\t(no devices)\t\t\t\t\t\t\t\t\t\t\t\n", n.Name)
		}
		for i := range n.Model.Devices {
			d := &n.Model.Devices[i]
			profile, uuid := "-", d.UUID()
			switch {
			case d.Placement != nil:
				// Dynamic: the profile at its placement, created at Prepare.
				profile = fmt.Sprintf("%s@%d", d.Placement.Profile.Name, d.Placement.Start)
				if uuid == "" {
					uuid = "(created at Prepare)"
				}
			case d.MIG != nil:
				profile = d.MIG.Profile
			}
			// A capacity left out (memory discovery could not read) is
			// no 0.
			mem := "-"
			if c, ok := d.API.Capacity[devicemodel.CapMemory]; ok {
				mem = c.Value.String()
			}
			sharing := "-"
			if d.Sharing.Enabled() {
				sharing = d.Sharing.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				n.Name, d.Name(), d.Kind, sharing, d.GPU.ProductName, mem, profile,
				attr(d, deviceattribute.StandardDeviceAttributePCIBusID), attr(d, deviceattribute.StandardDeviceAttributePCIeRoot),
				attr(d, deviceattribute.StandardDeviceAttributeNUMANode), n.health(d.GPU.UUID), taints(d.API.Taints), uuid)
		}
		// GPUs NVML lists but discovery left out (lost, unreadable): no
		// device, but a line, so that nobody counts them as missing.
		for _, c := range n.Health {
			if !slices.ContainsFunc(n.Inventory.GPUs, func(g hardware.GPU) bool { return c.UUID != "" && g.UUID == c.UUID }) {
				uuid := c.UUID
				if uuid == "" {
					uuid = "-"
				}
				fmt.Fprintf(tw, "%s\t(NVML GPU %d)\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t-\t%s\n", n.Name, c.Index, c, uuid)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i := range nodes {
		n := &nodes[i]
		inv := n.Inventory
		fmt.Fprintf(w, "\n%s: %d GPUs, %d devices, driver %s, CUDA %s, %d ResourceSlice(s)%s\n",
			n.Name, len(inv.GPUs), len(n.Model.Devices), inv.DriverVersion, inv.CUDADriverVersion, len(n.Model.Slices()), sharingSummary(n.Model))
		for _, line := range healthNotes(n) {
			fmt.Fprintf(w, "  %s\n", line)
		}
		for _, line := range n.Notes {
			fmt.Fprintf(w, "  publish: %s\n", line)
		}
	}
	return nil
}

// prefixed is s after p, or "" when s is empty.
func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// healthNotes are the lines under a node's summary that say what is
// wrong with its GPUs: problems discovery met (GPUs left out, properties
// of published GPUs it could not read), GPUs that are not healthy, and
// what the health check could not tell.
func healthNotes(n *Node) []string {
	var out []string
	for _, p := range n.Inventory.Problems {
		out = append(out, "discovery: "+p.Err)
	}
	for _, g := range n.Inventory.GPUs {
		for _, u := range g.Unread {
			out = append(out, fmt.Sprintf("discovery: GPU %d (%s) published without %s: %s: %s", g.Index, g.UUID, u.Property, u.Query, u.Err))
		}
	}
	if n.HealthErr != nil {
		out = append(out, "health: cannot check: "+n.HealthErr.Error())
	}
	unreported := 0
	for _, c := range n.Health {
		switch {
		case c.Lost:
			out = append(out, fmt.Sprintf("health: GPU %d%s is lost (NVML_ERROR_GPU_IS_LOST) and needs a GPU reset or a reboot; a running plugin taints its devices gpu.nvidia.com/gpu-lost, a starting one leaves them out", c.Index, prefixed(" ", c.UUID)))
		case c.Err != "":
			out = append(out, "health: "+c.Err)
		case c.Recovery == hardware.RecoveryUnreported:
			unreported++
		case !c.Healthy():
			out = append(out, fmt.Sprintf("health: GPU %d %s: the driver asks for a %s before it is used again", c.Index, c.UUID, c.Recovery))
		}
	}
	if unreported > 0 {
		out = append(out, fmt.Sprintf("health: the driver reports no recovery actions (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION needs R570 or newer), so %d GPU(s) show ok unless lost", unreported))
	}
	return out
}

// sharingSummary says how the node shares its full GPUs, and what a claim
// that asks for no capacity gets; "" when it shares none.
func sharingSummary(m *devicemodel.Model) string {
	shared := 0
	var s devicemodel.Sharing
	for i := range m.Devices {
		if m.Devices[i].Sharing.Enabled() {
			shared++
			s = m.Devices[i].Sharing
		}
	}
	if shared == 0 {
		return ""
	}
	plain := "the whole GPU"
	if s.ShareByDefault {
		plain = "one share"
		if s.Mode == devicemodel.SharingUnlimited {
			plain = "no memory, uncapped"
		}
	}
	return fmt.Sprintf("; %d GPU(s) shared (%s): a claim that asks for no capacity gets %s", shared, s, plain)
}

// taints renders device taints as kubectl renders node taints:
// "gpu.nvidia.com/xid=79:NoSchedule", comma-separated; "-" for none.
func taints(ts []resourceapi.DeviceTaint) string {
	if len(ts) == 0 {
		return "-"
	}
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.Key
		if t.Value != "" {
			parts[i] += "=" + t.Value
		}
		parts[i] += ":" + string(t.Effect)
	}
	return strings.Join(parts, ",")
}

func attr(d *devicemodel.Device, name resourceapi.QualifiedName) string {
	if text, ok := devicemodel.AttributeText(d.API.Attributes[name]); ok {
		return text
	}
	return "-"
}
