package deviceplugin

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// resourceServer serves one resource over the device-plugin API on its
// own socket.
type resourceServer struct {
	pluginapi.UnimplementedDevicePluginServer

	res    Resource
	byID   map[string]*Device
	socket string
	p      *Plugin
	server *grpc.Server

	mu sync.Mutex
	// watchers get the device list whenever health changes.
	watchers map[chan []*pluginapi.Device]bool
}

// SocketName is the socket file of a resource's server:
// gpudra-gpu.sock, gpudra-mig-1g.10gb.sock.
func SocketName(resource string) string {
	return "gpudra-" + strings.ReplaceAll(strings.TrimPrefix(resource, "nvidia.com/"), "/", "-") + ".sock"
}

func newResourceServer(p *Plugin, res Resource) *resourceServer {
	s := &resourceServer{res: res, p: p, socket: filepath.Join(p.opts.PluginDir, SocketName(res.Name)), watchers: map[chan []*pluginapi.Device]bool{}}
	s.byID = make(map[string]*Device, len(res.Devices))
	for i := range s.res.Devices {
		s.byID[s.res.Devices[i].ID] = &s.res.Devices[i]
	}
	return s
}

// serve listens on the socket (replacing a stale one) and serves until
// stop.
func (s *resourceServer) serve(logger klog.Logger) error {
	if err := os.Remove(s.socket); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove stale socket %s: %w", s.socket, err)
	}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.socket, err)
	}
	s.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s.server, s)
	go func() {
		if err := s.server.Serve(l); err != nil {
			logger.Error(err, "Device-plugin server stopped", "resource", s.res.Name)
		}
	}()
	return nil
}

func (s *resourceServer) stop() {
	if s.server != nil {
		s.server.Stop()
	}
	_ = os.Remove(s.socket)
	s.mu.Lock()
	for ch := range s.watchers {
		close(ch)
	}
	s.watchers = map[chan []*pluginapi.Device]bool{}
	s.mu.Unlock()
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (s *resourceServer) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: the devices with
// their health, again on every health change.
func (s *resourceServer) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	ch := make(chan []*pluginapi.Device, 1)
	s.mu.Lock()
	s.watchers[ch] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, ch)
		s.mu.Unlock()
	}()
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.devices()}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case devs, ok := <-ch:
			if !ok {
				return nil
			}
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
		}
	}
}

// devices is the device list with each device's health now.
func (s *resourceServer) devices() []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(s.res.Devices))
	for i := range s.res.Devices {
		d := &s.res.Devices[i]
		h := pluginapi.Healthy
		if !s.p.healthy(d.Device.GPU.UUID) {
			h = pluginapi.Unhealthy
		}
		out[i] = &pluginapi.Device{ID: d.ID, Health: h}
		if n := d.NUMANode(); n != nil {
			out[i].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(*n)}}}
		}
	}
	return out
}

// healthChanged sends the device list to every ListAndWatch stream.
func (s *resourceServer) healthChanged() {
	devs := s.devices()
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers {
		select {
		case <-ch: // replace an unsent list with the newer one
		default:
		}
		ch <- devs
	}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer.
func (s *resourceServer) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		ids, err := s.res.Preferred(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize))
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate implements pluginapi.DevicePluginServer: each container gets
// the CDI devices of the underlying GPUs or MIG devices (and, as the
// strategies say, NVIDIA_VISIBLE_DEVICES, CDI annotations, device specs).
func (s *resourceServer) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	byID := s.byID
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		if s.res.FailRequestsGreaterThanOne && len(cr.DevicesIds) > 1 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: a container asked for %d replicas, and sharing.timeSlicing.failRequestsGreaterThanOne refuses more than 1: replicas of one GPU are time slices of it, not more GPU", s.res.Name, len(cr.DevicesIds))
		}
		underlying := map[string]*Device{}
		for _, id := range cr.DevicesIds {
			d, ok := byID[id]
			if !ok {
				return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device %q", s.res.Name, id)
			}
			if !s.p.healthy(d.Device.GPU.UUID) {
				return nil, status.Errorf(codes.FailedPrecondition, "%s: device %q is unhealthy", s.res.Name, id)
			}
			underlying[d.CDIName()] = d
		}
		resp.ContainerResponses = append(resp.ContainerResponses, s.p.containerResponse(slices.Sorted(maps.Keys(underlying)), underlying))
	}
	return resp, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; gpudra asks
// for no pre-start call.
func (s *resourceServer) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// containerResponse is what one container gets for the named underlying
// devices.
func (p *Plugin) containerResponse(names []string, devs map[string]*Device) *pluginapi.ContainerAllocateResponse {
	r := &pluginapi.ContainerAllocateResponse{}
	var visible, cdiNames []string
	for _, name := range names {
		d := devs[name]
		id := d.UUID()
		if p.plan.DeviceIDStrategy == DeviceIDIndex {
			id, _, _ = strings.Cut(d.ID, ReplicaSeparator)
		}
		visible = append(visible, id)
		cdiNames = append(cdiNames, p.cdiKind+"="+name)
	}
	for _, s := range p.opts.DeviceListStrategies {
		switch s {
		case DeviceListEnvVar:
			r.Envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(visible, ",")}
		case DeviceListCDICRI:
			for _, n := range cdiNames {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		case DeviceListCDIAnnotations:
			r.Annotations = map[string]string{p.opts.CDIAnnotationPrefix + "gpudra-device-plugin": strings.Join(cdiNames, ",")}
		}
	}
	if p.opts.PassDeviceSpecs {
		seen := map[string]bool{}
		addNode := func(n *cdispec.DeviceNode) {
			if !seen[n.Path] {
				seen[n.Path] = true
				r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: n.Path, Permissions: "rw"})
			}
		}
		for _, n := range p.spec.ContainerEdits.DeviceNodes {
			addNode(n)
		}
		for _, name := range names {
			for _, d := range p.spec.Devices {
				if d.Name == name {
					for _, n := range d.ContainerEdits.DeviceNodes {
						addNode(n)
					}
				}
			}
		}
	}
	return r
}
