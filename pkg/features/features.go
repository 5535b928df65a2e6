// Package features registers gpudra's device features: one package each
// under pkg/features, each a configurator of the preparer and, where it
// shapes what the node publishes, a publisher. The kubelet plugin and
// `gpudra inspect` get the same set from here, so that what inspect shows
// is what the plugin publishes. Adding a feature adds its package and a
// line in New.
package features

import (
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/features/devicehealth"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/features/migmode"
	mpsfeature "github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/features/sharing"
	timeslicingfeature "github.com/gpudra/gpudra/pkg/features/timeslicing"
	vfiofeature "github.com/gpudra/gpudra/pkg/features/vfio"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// Options are the node's feature settings.
type Options struct {
	// DynamicMIG publishes dynamic MIG devices; MIG creates and destroys
	// them (nil: static MIG whatever DynamicMIG says).
	DynamicMIG bool
	MIG        hardware.MIGManager
	// MIGModeSwitcher, if set with DynamicMIG, switches MIG modes at
	// Prepare; MIGModeNode rediscovers after a switch.
	MIGModeSwitcher hardware.MIGModeSwitcher
	MIGModeNode     migmode.Node
	// VFIO, if set, offers GPUs for passthrough.
	VFIO *vfiofeature.Config
	// TimeSlicer sets time slices (nil refuses TimeSlicing); DataDir holds
	// its lock file and State reads the checkpoint.
	TimeSlicer timeslicing.Setter
	DataDir    string
	State      timeslicingfeature.State
	// MPS runs MPS daemons (nil refuses MPS, MPSUnavailable says why).
	MPS            *mps.Manager
	MPSUnavailable string
	// Sharing publishes full GPUs shareable.
	Sharing devicemodel.Sharing
	// Health, if set, taints (or withdraws) the devices of unhealthy
	// GPUs. It runs last, on what the other publishers made.
	Health *devicehealth.Publisher
}

// Set is the node's features.
type Set struct {
	// Configurators in the order they apply (and undo in reverse): the
	// MIG mode before the MIG devices, MIG devices before the passthrough
	// and sharing that use them, the MPS daemon last since it serves
	// devices by UUID.
	Configurators []preparer.Configurator
	// Publishers in the order they shape the publication.
	Publishers []preparer.Publisher
	// MIG is the MIG publisher, for the plugin's startup log.
	MIG *dynamicmig.Publisher
	// Health is Options.Health, for the plugin's health watch; nil: the
	// plugin watches no health.
	Health *devicehealth.Publisher
	// Build builds the device model the publishers shape; nil means
	// devicemodel.Build (the GPU driver's). Another driver's set (the
	// ComputeDomain channel driver's) brings its own.
	Build preparer.ModelBuilder
}

// New builds the node's features.
func New(o Options) (*Set, error) {
	dynamic := o.DynamicMIG && o.MIG != nil
	var switchable func(hardware.GPU) bool
	var switcher hardware.MIGModeSwitcher
	if dynamic && o.MIGModeSwitcher != nil {
		switchable, switcher = migmode.CanSwitch, o.MIGModeSwitcher
	}
	vfio, err := vfiofeature.New(o.VFIO)
	if err != nil {
		return nil, err
	}
	shares, err := sharing.NewPublisher(o.Sharing)
	if err != nil {
		return nil, err
	}
	migPublisher := dynamicmig.NewPublisher(dynamic, switchable)
	publishers := []preparer.Publisher{migPublisher, vfio, shares}
	if o.Health != nil {
		publishers = append(publishers, o.Health)
	}
	return &Set{
		Configurators: []preparer.Configurator{
			preparer.Adapt[migmode.Record](migmode.New(switcher, o.MIGModeNode)),
			preparer.Adapt[dynamicmig.Record](dynamicmig.New(o.MIG, migPublisher.Dynamic)),
			preparer.Adapt[vfiofeature.Record](vfio),
			preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(o.TimeSlicer, o.DataDir, o.State, o.MPS != nil)),
			preparer.Adapt[mpsfeature.Record](mpsfeature.New(o.MPS, o.MPSUnavailable, o.TimeSlicer != nil)),
		},
		Publishers: publishers,
		MIG:        migPublisher,
		Health:     o.Health,
	}, nil
}

// ComputeDomainOptions are the channel driver's settings.
type ComputeDomainOptions struct {
	// Channels says which channel a domain's pods get.
	Channels imexchannel.Channels
	// MaxChannels is the node's IMEX channel count; 0 means
	// imexchannel.DefaultMaxChannels.
	MaxChannels int
	// SharedChannel publishes channel-0 for several claims at once.
	SharedChannel bool
	// Daemon is the node's IMEX daemon, which channel claims hold and
	// Prepare waits for; nil serves channels only.
	Daemon imexchannel.Daemon
}

// NewComputeDomain builds the features of the ComputeDomain channel driver
// (compute-domain.nvidia.com): its devices and the channel configurator.
// The kubelet plugin shell runs them as it runs the GPU driver's.
func NewComputeDomain(o ComputeDomainOptions) *Set {
	p := imexchannel.NewPublisher(o.SharedChannel)
	return &Set{
		Configurators: []preparer.Configurator{
			preparer.Adapt[imexchannel.Record](imexchannel.New(o.Channels, o.MaxChannels).WithDaemon(o.Daemon)),
		},
		Publishers: []preparer.Publisher{p},
		Build:      p.Build,
	}
}

// Fallbacks are the publishers' fallbacks.
func (s *Set) Fallbacks() []preparer.Fallback {
	var out []preparer.Fallback
	for _, p := range s.Publishers {
		if f, ok := p.(preparer.FallbackProvider); ok {
			out = append(out, f.Fallbacks()...)
		}
	}
	return out
}
