package sim

import (
	"fmt"

	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// GPUSharing is how the node's plugin shares full GPUs, from its sharing
// and sharingDefault fields; the zero Sharing when neither is set.
func (n *Node) GPUSharing() (devicemodel.Sharing, error) {
	var s devicemodel.Sharing
	var err error
	if n.Sharing != "" {
		if s, err = devicemodel.ParseSharing(n.Sharing); err != nil {
			return devicemodel.Sharing{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if n.SharingDefault != "" {
		if s.ShareByDefault, err = devicemodel.ParseSharingDefault(n.SharingDefault); err != nil {
			return devicemodel.Sharing{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return s, nil
}
