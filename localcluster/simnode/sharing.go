package simnode

import (
	"context"
	"maps"
	"slices"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpudra/gpudra/pkg/mps"
)

// sharingOf returns how a container's devices are shared: the MPS daemons
// whose pipe directories its mounts bring in, with their caps, and the
// time slices set on its full GPUs.
func (n *Node) sharingOf(ctx context.Context, mounts []oci.Mount, claims []PreparedClaim) ([]MPSDaemon, []TimeSlice, error) {
	n.pluginMu.Lock()
	manager, driver := n.mps, n.plugin
	n.pluginMu.Unlock()

	var daemons []MPSDaemon
	for _, m := range mounts {
		if m.Destination != mps.ContainerPipeDir || manager == nil {
			continue
		}
		all, err := manager.List(ctx)
		if err != nil {
			return nil, nil, err
		}
		for _, st := range all {
			if st.Dirs.Pipe != m.Source {
				continue
			}
			daemons = append(daemons, MPSDaemon{
				ID: st.Spec.ID, Devices: slices.Clone(st.Spec.DeviceUUIDs),
				ActiveThreadPercentage: st.Spec.ActiveThreadPercentage, PinnedMemoryLimits: maps.Clone(st.Spec.PinnedMemoryLimits),
			})
		}
	}

	if driver == nil {
		return daemons, nil, nil
	}
	uuids := map[string]string{}
	for _, d := range driver.Devices() {
		if a, ok := d.Attributes["uuid"]; ok && a.StringValue != nil {
			uuids[d.Name] = *a.StringValue
		}
	}
	var intervals []TimeSlice
	for _, c := range claims {
		for _, d := range c.Devices {
			if d.Driver != n.cfg.DriverName || d.Pool != n.cfg.Name {
				continue
			}
			gpu, ok := uuids[d.Device]
			if !ok {
				continue
			}
			if iv, ok := n.timeSlices.Interval(gpu); ok {
				intervals = append(intervals, TimeSlice{Device: d.Device, GPU: gpu, Interval: string(iv)})
			}
		}
	}
	return daemons, intervals, nil
}
