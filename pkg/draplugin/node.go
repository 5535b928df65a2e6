package draplugin

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/claimconfig"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// configFeatures is what the opaque configs are validated against, the
// same as the webhook's.
var configFeatures = claimconfig.ValidationFeatures

// node is the preparer's view of the node: the published devices and the
// API server's allocations. It implements [preparer.Node].
type node struct{ d *Driver }

var _ preparer.Node = &node{}

// Claim implements [preparer.Node]. It has no side effects, except that it
// discovers the GPUs again when the nvidia-uvm module was not loaded at the
// last discovery.
func (n *node) Claim(ctx context.Context, claim *resourceapi.ResourceClaim, intent claimstate.Intent) (*preparer.Claim, *cdispec.ContainerEdits, error) {
	d := n.d
	pub := d.current()
	// Containers of a GPU the host driver serves need /dev/nvidia-uvm;
	// VFIO passthrough and devices that are no GPU (IMEX channels) do not.
	needsUVM := slices.ContainsFunc(intent.Devices, func(cd claimstate.Device) bool {
		dev, ok := pub.Model.Lookup(cd.Name)
		return ok && dev.GPU.UUID != "" && dev.Kind != devicemodel.KindVFIO
	})
	if pub.Inventory.Majors.UVM == 0 && len(pub.Inventory.GPUs) > 0 && needsUVM {
		// nvidia-uvm loads lazily on hosts with a host-installed driver;
		// its major may exist by now.
		if err := d.discover(ctx); err == nil {
			pub = d.current()
		}
		if pub.Inventory.Majors.UVM == 0 {
			return nil, nil, fmt.Errorf("the nvidia-uvm kernel module is not loaded (no nvidia-uvm in /proc/devices), and CUDA containers need /dev/nvidia-uvm: load it on the node (modprobe nvidia-uvm, or nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules)")
		}
	}
	c := &preparer.Claim{UID: intent.UID, Namespace: intent.Namespace, Name: intent.Name, Consumers: intent.Consumers, Inventory: pub.Inventory}
	for i := range intent.Devices {
		cd := intent.Devices[i]
		dev, ok := pub.Model.Lookup(cd.Name)
		if !ok {
			return nil, nil, fmt.Errorf("request %s: device %s is not a device of node %s (it has %d devices)", firstRequest(cd), cd.Name, d.cfg.NodeName, len(pub.Model.Devices))
		}
		// The hardware identity the conflict checks compare: a MIG device
		// created at Prepare gets its UUID then, but its parent is known.
		switch {
		case dev.Placement != nil:
			if cd.UUID == "" {
				cd.ParentUUID = dev.GPU.UUID
			}
		case dev.MIG != nil:
			cd.UUID, cd.ParentUUID = dev.UUID(), dev.GPU.UUID
		case dev.GPU.UUID != "":
			cd.UUID = dev.GPU.UUID
		}
		c.Devices = append(c.Devices, &preparer.Device{State: &cd, Model: dev})
	}
	kindOf := func(r resourceapi.DeviceRequestAllocationResult) (claimconfig.DeviceKind, error) {
		dev, ok := pub.Model.Lookup(r.Device)
		if !ok {
			return "", fmt.Errorf("device %s is not a device of this node", r.Device)
		}
		return configKind(dev), nil
	}
	resolved, err := claimconfig.Resolve(d.cfg.DriverName, claim, kindOf, configFeatures)
	if err != nil {
		return nil, nil, err
	}
	if len(resolved) != len(c.Devices) {
		return nil, nil, fmt.Errorf("claim has %d devices of this driver but %d resolved configs", len(c.Devices), len(resolved))
	}
	for i := range resolved {
		c.Devices[i].Config = resolved[i]
	}
	common, err := d.cfg.DriverEdits.CommonEdits(ctx, pub.Inventory.DriverVersion)
	if err != nil {
		return nil, nil, fmt.Errorf("driver files for CDI: %w", err)
	}
	return c, common, nil
}

func firstRequest(cd claimstate.Device) string {
	if len(cd.Requests) == 0 {
		return "(unknown)"
	}
	return cd.Requests[0]
}

// Allocated implements [preparer.Node].
func (n *node) Allocated(ctx context.Context) ([]preparer.AllocatedClaim, error) {
	d := n.d
	callCtx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	list, err := d.cfg.KubeClient.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(callCtx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	var out []preparer.AllocatedClaim
	for i := range list.Items {
		claim := &list.Items[i]
		if claim.Status.Allocation == nil {
			continue
		}
		intent, err := preparer.IntentOf(claim, d.cfg.DriverName, d.cfg.NodeName)
		if err != nil || len(intent.Devices) == 0 {
			continue
		}
		out = append(out, preparer.AllocatedClaim{Claim: claim, Intent: intent})
	}
	return out, nil
}

// Inventory implements [preparer.Node].
func (n *node) Inventory() *hardware.Inventory {
	if s := n.d.state.Load(); s != nil {
		return s.Inventory
	}
	return nil
}

// Discover implements [preparer.Discoverer]: the hardware as it is now,
// without publishing it.
func (n *node) Discover(ctx context.Context) (*hardware.Inventory, error) {
	return n.d.cfg.Hardware.Discover(ctx)
}

// Model implements [preparer.Node].
func (n *node) Model() *devicemodel.Model {
	if s := n.d.state.Load(); s != nil {
		return s.Model
	}
	return nil
}

// configKind is the config kind a device of the model takes.
func configKind(dev *devicemodel.Device) claimconfig.DeviceKind {
	switch dev.Kind {
	case devicemodel.KindMIG:
		return claimconfig.MIG
	case devicemodel.KindVFIO:
		return claimconfig.VFIO
	case devicemodel.KindChannel:
		return claimconfig.Channel
	case devicemodel.KindDaemon:
		return claimconfig.Daemon
	}
	return claimconfig.GPU
}

// modeSwitchNode is what the MIG mode configurator needs of the plugin.
type modeSwitchNode struct{ d *Driver }

// Rediscover discovers the GPUs again, makes the result current and asks
// the discovery loop to republish: the published devices follow the new
// modes without holding up the Prepare that switched them.
func (m modeSwitchNode) Rediscover(ctx context.Context) (*hardware.Inventory, error) {
	if err := m.d.discover(ctx); err != nil {
		return nil, err
	}
	select {
	case m.d.rebuild <- struct{}{}:
	default:
	}
	return m.d.current().Inventory, nil
}

// Event records a Node event.
func (m modeSwitchNode) Event(eventType, reason, message string) {
	m.d.Event(eventType, reason, message)
}
