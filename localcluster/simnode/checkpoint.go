package simnode

import (
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/features/migmode"
	"github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/features/timeslicing"
	"github.com/gpudra/gpudra/pkg/features/vfio"
)

// CheckpointRecords are the names of the claim records gpudra's plugins
// write, every feature's: a checkpoint read with all of them known is
// read whatever the plugin recorded, as `gpudra inspect` reads it.
var CheckpointRecords = []string{migmode.Name, dynamicmig.Name, vfio.Name, timeslicing.Name, mps.Name, imexchannel.Name}

// PeekCheckpoint reads the prepared claims of the gpudra checkpoint in dir
// (a plugin's data directory) as the plugin would find them, read-only:
// see checkpoint.Peek. No file is no claims; a checkpoint that needs
// adoption is an error.
func PeekCheckpoint(dir string, opts ...checkpoint.Option) (*claimstate.State, error) {
	return checkpoint.Peek(dir, append([]checkpoint.Option{checkpoint.WithKnownRecords(CheckpointRecords...)}, opts...)...)
}

// Checkpoint returns the prepared claims of the node's gpudra plugin, read
// from its checkpoint (PeekCheckpoint).
func (n *Node) Checkpoint() (*claimstate.State, error) {
	return PeekCheckpoint(n.PluginDataDir(), checkpoint.WithPool(n.cfg.Name), checkpoint.WithDriverName(n.cfg.DriverName))
}
