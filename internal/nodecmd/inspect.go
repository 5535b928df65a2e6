package nodecmd

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/inspect"
	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/pluginflags"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

type inspectOptions struct {
	hw         pluginflags.Discovery
	vfio       pluginflags.VFIO
	node       string
	output     string
	driverName string
	migMode    string
	sharing    pluginflags.GPUSharing
	pluginDir  string
}

// NewInspectCommand prints what the node's kubelet plugin would publish;
// the kubelet plugin's DaemonSet runs it as its init container.
func NewInspectCommand() *cobra.Command {
	o := &inspectOptions{}
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Print what this node's kubelet plugin would publish",
		Long: `Print the devices this node's kubelet plugin would publish.

On a GPU node (no --fleet) the GPUs are discovered through NVML. With --fleet
a simulated fleet is shown instead: all its nodes, or the one --node names.
-o yaml prints only the ResourceSlice objects, one YAML document each, so the
output can be piped to kubectl on a node where the plugin does not run (it
is refused while one serves the node); they are labelled
app.kubernetes.io/managed-by=gpudra-inspect, to be deleted before the plugin
starts.`,
		Example: `  gpudra inspect --fleet dgx-h100
  gpudra inspect --fleet demo --node dgx-a100-0 -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	fs := cmd.Flags()
	o.hw.AddFlags(fs)
	fs.StringVar(&o.node, "node", "", "node to show: a node of the fleet (default: all of them), or the name to give this node (default: its hostname)")
	fs.StringVarP(&o.output, "output", "o", inspect.Formats[0], "output format: "+strings.Join(inspect.Formats, "|"))
	fs.StringVar(&o.driverName, "driver-name", v1beta1.GPUDriverName, "DRA driver name")
	o.vfio.AddFlags(fs)
	o.sharing.AddFlags(fs, "as for kubelet-plugin: none, memory-compute, shares=<N> or unlimited (a simulated fleet's node may set its own)")
	fs.StringVar(&o.pluginDir, "plugin-data-dir", "", "the kubelet plugin's directory on this node (default /var/lib/kubelet/plugins/<driver-name>): its checkpoint says which MIG instances are gpudra's, and -o yaml and -o json are refused while a plugin listens there, since its slices already publish this node's pool")
	fs.StringVar(&o.migMode, "mig-mode", string(draplugin.MIGModeDynamic), fmt.Sprintf("as for kubelet-plugin, one of %v (a simulated fleet's node may set its own) (MIG instances that no claim in the plugin's checkpoint under --plugin-data-dir owns, which it reads without changing it, are shown as the static MIG devices the plugin publishes them as; a simulated fleet without --plugin-data-dir has no claims)", draplugin.MIGModes))
	return cmd
}

func (o *inspectOptions) run(cmd *cobra.Command) error {
	if !slices.Contains(inspect.Formats, o.output) {
		return fmt.Errorf("--output %q: supported values: %s", o.output, strings.Join(inspect.Formats, ", "))
	}
	if !slices.Contains(draplugin.MIGModes, draplugin.MIGMode(o.migMode)) {
		return fmt.Errorf("--mig-mode %q: must be one of %v", o.migMode, draplugin.MIGModes)
	}
	if err := o.hw.Validate(); err != nil {
		return err
	}
	if err := o.vfio.Validate(); err != nil {
		return err
	}
	if o.output != "table" {
		dir := o.pluginDir
		if dir == "" {
			dir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
		}
		if sock := nodemode.DRAPluginListening(dir); sock != "" {
			return fmt.Errorf("-o %s: a kubelet plugin of %s serves this node (it listens on %s), and its ResourceSlices already publish the node's pool: "+
				"applying these would put a second copy of every device in that pool, and pods could not be scheduled until the plugin removed them. "+
				"Use -o table to see what it publishes, or kubectl get resourceslices --field-selector spec.nodeName=<node> for what it published", o.output, o.driverName, sock)
		}
	}
	names, err := o.nodeNames()
	if err != nil {
		return err
	}
	var nodes []inspect.Node
	for _, name := range names {
		hw, fleetMIGMode, err := o.hw.NodeHardware(name)
		if err != nil {
			return err
		}
		mode := o.migMode
		if fleetMIGMode != "" && !cmd.Flags().Changed("mig-mode") {
			mode = fleetMIGMode
		}
		inv, err := hw.Discover(cmd.Context())
		if err != nil {
			return fmt.Errorf("node %s: discover GPUs: %w", name, err)
		}
		set, err := o.features(cmd, name, mode, hw)
		if err != nil {
			return err
		}
		// The plugin's own publishing rules, fed the prepared claims its
		// checkpoint records: which MIG instances are gpudra's decides
		// what a GPU holding them offers.
		state, stateNote := o.preparedClaims(name, set)
		pub, err := preparer.Publish(set.Build, inv, nil, state, set.Publishers)
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		node := inspect.Node{Name: name, Inventory: pub.Inventory, Model: pub.Model}
		if stateNote != "" {
			node.Notes = append(node.Notes, stateNote)
		}
		for _, n := range pub.Notices {
			node.Notes = append(node.Notes, n.Reason+": "+n.Message)
		}
		if checker, ok := hw.(hardware.HealthChecker); ok && o.output == "table" {
			node.Health, node.HealthErr = checker.CheckHealth(cmd.Context())
			if node.HealthErr == nil && node.Health == nil {
				node.Health = []hardware.GPUCondition{}
			}
		}
		nodes = append(nodes, node)
	}
	return inspect.Write(cmd.OutOrStdout(), o.output, o.driverName, nodes)
}

// features are the features the node's plugin would publish with: MIG
// mode, passthrough and sharing as the flags (or the simulated node) say.
// Passthrough beside CUDA devices is shown as if the API server had
// partitionable devices.
func (o *inspectOptions) features(cmd *cobra.Command, node, migMode string, hw hardware.Hardware) (*features.Set, error) {
	fo := features.Options{DynamicMIG: draplugin.MIGMode(migMode) == draplugin.MIGModeDynamic}
	fo.MIG, _ = hw.(hardware.MIGManager)
	fleetNode, err := o.hw.FleetNode(node)
	if err != nil {
		return nil, err
	}
	vfioConfig, err := o.vfio.Config(&o.hw, fleetNode)
	if err != nil {
		return nil, err
	}
	fo.VFIO = vfioConfig
	if fo.Sharing, err = o.sharing.Resolve(cmd.Flags(), fleetNode); err != nil {
		return nil, err
	}
	return features.New(fo)
}

// preparedClaims reads the prepared claims from the plugin's checkpoint,
// read-only, as the plugin would find them. A simulated node without
// --plugin-data-dir is a node the plugin has not run on: no claims, so
// every existing MIG instance is an operator's. When the checkpoint
// cannot be read, the claims are unknown (nil), as the plugin takes them
// then, and the note says so.
func (o *inspectOptions) preparedClaims(node string, set *features.Set) (*claimstate.State, string) {
	if o.hw.Simulated() && o.pluginDir == "" {
		return claimstate.New(), ""
	}
	dir := o.pluginDir
	if dir == "" {
		dir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	state, err := checkpoint.Peek(dir, checkpoint.WithPool(node), checkpoint.WithDriverName(o.driverName),
		checkpoint.WithKnownRecords(preparer.RecordNames(set.Configurators)...))
	if err != nil {
		return nil, fmt.Sprintf("checkpoint: %v; MIG instances are taken as gpudra's, as the plugin takes them while it cannot read its records", err)
	}
	return state, ""
}

func (o *inspectOptions) nodeNames() ([]string, error) {
	if !o.hw.Simulated() {
		if o.node != "" {
			return []string{o.node}, nil
		}
		return []string{pluginflags.Hostname()}, nil
	}
	if o.node != "" {
		return []string{o.node}, nil
	}
	fleet, err := simfleet.Load(o.hw.Fleet)
	if err != nil {
		return nil, err
	}
	return fleet.NodeNames(), nil
}
