// Package migmode is the configurator that switches a GPU's MIG mode at
// Prepare (dynamic MIG with --mig-mode-switching): Hopper and newer GPUs
// are published both whole and as MIG devices, whatever their mode, and a
// claim's device decides the mode. It applies before the MIG devices are
// created. A switched mode is left as it is at Unprepare: the next claim
// switches again if it needs the other mode, and switching back for
// nothing would cost a GPU reset.
package migmode

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Name is the configurator's record name in the checkpoint.
const Name = "migMode"

// Record lists the switches of one claim.
type Record struct {
	GPUs []Switch `json:"gpus"`
}

// Switch is one GPU's MIG mode change.
type Switch struct {
	UUID   string `json:"uuid"`
	Enable bool   `json:"enable"`
}

// Node is what the configurator needs of the plugin around it.
type Node interface {
	// Rediscover discovers the GPUs again after a switch (a switch may
	// reset the GPU and change its minor number), makes the result
	// current and asks for the devices to be published again.
	Rediscover(ctx context.Context) (*hardware.Inventory, error)
	// Event records a Node event.
	Event(eventType, reason, message string)
}

// Configurator switches MIG modes.
type Configurator struct {
	switcher hardware.MIGModeSwitcher
	node     Node
}

var (
	_ preparer.Feature[Record]  = &Configurator{}
	_ preparer.RecordlessUndoer = &Configurator{}
)

// New returns the configurator; switcher nil switches nothing.
func New(switcher hardware.MIGModeSwitcher, node Node) *Configurator {
	return &Configurator{switcher: switcher, node: node}
}

// CanSwitch reports whether gpudra may switch the GPU's MIG mode at
// Prepare: Hopper and newer switch without a node reboot; Ampere needs a
// GPU reset, which gpudra never does.
func CanSwitch(gpu hardware.GPU) bool {
	return gpu.MIGCapable && gpu.Architecture != "" && gpu.Architecture != "Ampere"
}

// Name implements [preparer.Feature].
func (c *Configurator) Name() string { return Name }

// Plan implements [preparer.Feature]: MIG on for a dynamic MIG device
// of a GPU in MIG mode off, MIG off for a full GPU in MIG mode on.
func (c *Configurator) Plan(_ context.Context, cl *preparer.Claim) (*Record, error) {
	if c.switcher == nil {
		return nil, nil
	}
	var rec Record
	seen := map[string]bool{}
	for _, d := range cl.Devices {
		gpu := d.Model.GPU
		if seen[gpu.UUID] {
			continue
		}
		switch {
		case d.Model.Placement != nil && !gpu.MIGEnabled:
			rec.GPUs = append(rec.GPUs, Switch{UUID: gpu.UUID, Enable: true})
		case d.Model.Kind == devicemodel.KindGPU && gpu.MIGEnabled:
			rec.GPUs = append(rec.GPUs, Switch{UUID: gpu.UUID, Enable: false})
		default:
			continue
		}
		seen[gpu.UUID] = true
	}
	if len(rec.GPUs) == 0 {
		return nil, nil
	}
	return &rec, nil
}

// Apply implements [preparer.Feature]: it switches, discovers the
// GPUs again and points the claim's devices at the GPUs as they are now.
// A GPU whose switch to MIG mode fails is set back to a full GPU.
func (c *Configurator) Apply(ctx context.Context, cl *preparer.Claim, rec *Record) (*Record, error) {
	if c.switcher == nil {
		return nil, errors.New("this node cannot switch MIG modes")
	}
	for _, sw := range rec.GPUs {
		if err := c.switcher.SetMIGMode(ctx, sw.UUID, sw.Enable); err != nil {
			err = fmt.Errorf("switch MIG mode of GPU %s to %v: %w", sw.UUID, onOff(sw.Enable), err)
			if sw.Enable {
				if back := c.switcher.SetMIGMode(ctx, sw.UUID, false); back != nil {
					err = errors.Join(err, fmt.Errorf("set it back to MIG mode off: %w", back))
				}
			}
			c.node.Event(corev1.EventTypeWarning, "MIGModeSwitchFailed", err.Error()+"; the GPU stays a full GPU")
			if _, rerr := c.node.Rediscover(ctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("discover GPUs after a MIG mode switch: %w", rerr))
			}
			return nil, err
		}
		klog.FromContext(ctx).Info("Switched MIG mode", "gpu", sw.UUID, "migMode", onOff(sw.Enable))
		c.node.Event(corev1.EventTypeNormal, "MIGModeSwitched", fmt.Sprintf("MIG mode of GPU %s switched %s for a claim", sw.UUID, onOff(sw.Enable)))
	}
	inv, err := c.node.Rediscover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs after a MIG mode switch: %w", err)
	}
	for _, d := range cl.Devices {
		for gi := range inv.GPUs {
			if inv.GPUs[gi].UUID == d.Model.GPU.UUID {
				moved := *d.Model
				moved.GPU = inv.GPUs[gi]
				d.Model = &moved
			}
		}
	}
	cl.Inventory = inv
	return rec, nil
}

// Undo implements [preparer.Feature]. The mode stays as switched (see
// the package doc): nothing to undo.
func (c *Configurator) Undo(context.Context, string, *Record) error { return nil }

// UndoesWithoutRecord implements [preparer.RecordlessUndoer]: Undo does
// nothing, whatever the record says.
func (c *Configurator) UndoesWithoutRecord() {}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
