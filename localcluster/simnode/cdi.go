package simnode

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// ContainerDevices is what a container runtime would give one container
// for its claims: the CDI device IDs the kubelet passed, and the edits the
// CDI library resolved them into.
type ContainerDevices struct {
	// Claims are the container's claims as the DRA manager prepared
	// them: which device served which request. Unlike the claims'
	// allocations, this stays after the pod finished.
	Claims      []PreparedClaim   `json:"claims,omitempty"`
	CDIDevices  []string          `json:"cdiDevices"`
	Env         map[string]string `json:"env"`
	DeviceNodes []string          `json:"deviceNodes"`
	// Mounts are the container paths of the mounts the CDI edits add.
	Mounts []string `json:"mounts,omitempty"`
	// MPS are the MPS control daemons the container reaches through its
	// pipe directory mount, with the caps each enforces on its clients.
	MPS []MPSDaemon `json:"mps,omitempty"`
	// TimeSlices are the time-slice intervals set on the container's GPUs
	// when it started; a GPU nobody set one on has none here.
	TimeSlices []TimeSlice `json:"timeSlices,omitempty"`
}

// MPSDaemon is an MPS control daemon a container is a client of, as the
// node's plugin started it.
type MPSDaemon struct {
	// ID is the daemon's: its claim UID, with a share ID for a share of a
	// fractional GPU.
	ID string `json:"id"`
	// Devices are the UUIDs of the GPUs or MIG devices it serves.
	Devices []string `json:"devices"`
	// ActiveThreadPercentage caps the share of each device's SMs a client
	// may use; nil: not capped.
	ActiveThreadPercentage *int `json:"activeThreadPercentage,omitempty"`
	// PinnedMemoryLimits cap the device memory a client may pin, in
	// bytes, per device UUID.
	PinnedMemoryLimits map[string]int64 `json:"pinnedMemoryLimits,omitempty"`
}

// TimeSlice is the time-slice interval of one of a container's GPUs.
type TimeSlice struct {
	// Device is the device's name in the node's pool, GPU its UUID.
	Device   string `json:"device"`
	GPU      string `json:"gpu"`
	Interval string `json:"interval"`
}

// cdiResolver resolves CDI device IDs against one node's spec directory,
// as a container runtime does.
type cdiResolver struct {
	mu    sync.Mutex
	cache *cdi.Cache
	err   error
}

func newCDIResolver(dir string) *cdiResolver {
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	return &cdiResolver{cache: c, err: err}
}

// resolve injects the devices into an empty OCI spec and reports the
// result, and the mounts with their host paths; an unknown or
// unresolvable device is an error, as in a runtime.
func (r *cdiResolver) resolve(ids []string) (ContainerDevices, []oci.Mount, error) {
	out := ContainerDevices{CDIDevices: ids, Env: map[string]string{}}
	if len(ids) == 0 {
		return out, nil, nil
	}
	if r.err != nil {
		return out, nil, r.err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Errors of other specs do not concern these devices; InjectDevices
	// reports the ones that do.
	_ = r.cache.Refresh()
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := r.cache.InjectDevices(spec, ids...); err != nil {
		return out, nil, fmt.Errorf("CDI devices %v unresolved: %w", unresolved, err)
	}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out.Env[k] = v
	}
	for _, d := range spec.Linux.Devices {
		out.DeviceNodes = append(out.DeviceNodes, d.Path)
	}
	for _, m := range spec.Mounts {
		out.Mounts = append(out.Mounts, m.Destination)
	}
	slices.Sort(out.DeviceNodes)
	return out, spec.Mounts, nil
}

// PreparedClaim is one claim of a container as prepared on the node.
type PreparedClaim struct {
	Name    string           `json:"name"`
	Devices []PreparedDevice `json:"devices"`
}

// PreparedDevice is one device of a prepared claim.
type PreparedDevice struct {
	Requests []string `json:"requests"`
	Driver   string   `json:"driver"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
}
