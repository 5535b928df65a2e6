package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/mps"
)

// Options configure the device plugin.
type Options struct {
	// Hardware is the node's GPUs (NVML or a simulated node).
	Hardware hardware.Hardware
	// DriverName names the CDI vendor (k8s.<driver>), as for the DRA
	// plugin: gpu.nvidia.com.
	DriverName string
	// PluginDir is the kubelet's device-plugin directory, with its
	// kubelet.sock.
	PluginDir string
	// CDIDir is where the node-wide CDI spec is written.
	CDIDir string
	// DriverEdits are the driver's files for the CDI spec.
	DriverEdits cdi.DriverEdits
	// Plan chooses the resources.
	Plan PlanOptions
	// DeviceListStrategies say how a container learns its devices:
	// cdi-cri (default), envvar, cdi-annotations.
	DeviceListStrategies []string
	// CDIAnnotationPrefix is the prefix of the cdi-annotations strategy's
	// annotation (default cdi.k8s.io/).
	CDIAnnotationPrefix string
	// PassDeviceSpecs also lists the device nodes in the response.
	PassDeviceSpecs bool
	// HealthPolicy says which health events make a device unhealthy.
	HealthPolicy health.Policy
	// RegisterTimeout bounds one registration with the kubelet.
	RegisterTimeout time.Duration
	// MPS runs the MPS daemons of MPS-shared resources (sharing.mps); nil
	// refuses such a config.
	MPS *mps.Manager
}

// mpsDaemonPrefix starts the IDs of the device plugin's MPS daemons, one
// per GPU: device-plugin-gpu-3.
const mpsDaemonPrefix = "device-plugin-"

// mpsSuperviseInterval is how often the MPS daemons are checked.
const mpsSuperviseInterval = 5 * time.Second

// Plugin serves the node's resources to the kubelet.
type Plugin struct {
	opts      Options
	plan      PlanOptions
	cdiKind   string
	spec      *cdispec.Spec
	resources []Resource

	mu      sync.Mutex
	servers []*resourceServer
	health  *health.State
	// registrations counts successful registrations, for tests and logs.
	registrations int
}

// New discovers the node's GPUs, plans its resources and writes the CDI
// spec of their devices. It returns an error for a config the node's GPUs
// cannot satisfy, naming the field.
func New(ctx context.Context, o Options) (*Plugin, error) {
	if len(o.DeviceListStrategies) == 0 {
		o.DeviceListStrategies = []string{DeviceListCDICRI}
	}
	if o.CDIAnnotationPrefix == "" {
		o.CDIAnnotationPrefix = "cdi.k8s.io/"
	}
	if o.RegisterTimeout == 0 {
		o.RegisterTimeout = 10 * time.Second
	}
	if o.DriverEdits == nil {
		o.DriverEdits = cdi.NoDriverEdits{}
	}
	if o.HealthPolicy.FaultEffect == "" {
		o.HealthPolicy = health.DefaultPolicy()
	}
	if o.Plan.DeviceIDStrategy == "" {
		o.Plan.DeviceIDStrategy = DeviceIDUUID
	}
	inv, err := o.Hardware.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	logger := klog.FromContext(ctx)
	for _, p := range inv.Problems {
		logger.Info("GPU left out", "problem", p.Err)
	}
	for _, g := range inv.GPUs {
		for _, u := range g.Unread {
			logger.Info("GPU served without a property discovery could not read", "index", g.Index, "uuid", g.UUID, "property", u.Property, "query", u.Query, "err", u.Err)
		}
	}
	resources, err := Plan(inv, o.Plan)
	if err != nil {
		return nil, err
	}
	p := &Plugin{opts: o, plan: o.Plan, resources: resources, health: &health.State{}, cdiKind: cdi.Vendor(o.DriverName) + "/" + cdi.DeviceClass}
	if slices.ContainsFunc(resources, func(r Resource) bool { return r.MPS }) &&
		!slices.ContainsFunc(o.DeviceListStrategies, func(s string) bool { return s != DeviceListEnvVar }) {
		return nil, errors.New("sharing.mps: the MPS daemon's pipe directory reaches a container through CDI; use --device-list-strategy cdi-cri or cdi-annotations (envvar alone cannot mount it)")
	}
	daemons, err := p.startMPSDaemons(ctx)
	if err != nil {
		return nil, err
	}
	if p.spec, err = p.buildSpec(ctx, inv, daemons); err != nil {
		return nil, err
	}
	w, err := cdi.NewWriter(o.CDIDir, o.DriverName)
	if err != nil {
		return nil, err
	}
	if err := w.WriteDevices(p.spec); err != nil {
		return nil, err
	}
	for _, r := range resources {
		logger.Info("Serving resource", "resource", r.Name, "devices", len(r.Devices), "replicas", r.Replicas)
	}
	return p, nil
}

// startMPSDaemons starts (or takes over, after a restart) an MPS daemon
// per GPU of the MPS-shared resources, each client capped at 1/replicas of
// the GPU's SMs and memory (where discovery read it), and stops the device plugin's daemons of GPUs
// no longer shared so. It returns the daemons by GPU UUID.
func (p *Plugin) startMPSDaemons(ctx context.Context) (map[string]mps.Daemon, error) {
	daemons := map[string]mps.Daemon{}
	for _, r := range p.resources {
		if !r.MPS {
			continue
		}
		if p.opts.MPS == nil {
			return nil, fmt.Errorf("sharing.mps: %s needs MPS daemons, and this node has no nvidia-cuda-mps-control (see --mps-control-binary)", r.Name)
		}
		for _, d := range r.Devices {
			g := d.Device.GPU
			if _, ok := daemons[g.UUID]; ok {
				continue
			}
			threads := max(1, 100/r.Replicas)
			spec := mps.Spec{
				ID:                     mpsDaemonPrefix + devicemodel.GPUName(g.Minor),
				DeviceUUIDs:            []string{g.UUID},
				ActiveThreadPercentage: &threads,
			}
			// A GPU whose memory discovery could not read gets no memory
			// cap: a cap of 0 would leave its clients no memory at all.
			if g.MemoryBytes > 0 {
				spec.PinnedMemoryLimits = map[string]int64{g.UUID: int64(g.MemoryBytes) / int64(r.Replicas)}
			} else {
				klog.FromContext(ctx).Info("MPS replicas of a GPU whose memory is unknown share its memory uncapped", "resource", r.Name, "gpu", g.Index, "uuid", g.UUID)
			}
			daemon, err := p.opts.MPS.Start(ctx, spec)
			if err != nil {
				return nil, fmt.Errorf("sharing.mps: %s on GPU %d: %w", r.Name, g.Index, err)
			}
			daemons[g.UUID] = daemon
		}
	}
	if p.opts.MPS != nil {
		running, err := p.opts.MPS.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("list MPS daemons: %w", err)
		}
		wanted := map[string]bool{}
		for _, d := range daemons {
			wanted[d.Spec.ID] = true
		}
		for _, st := range running {
			if !strings.HasPrefix(st.Spec.ID, mpsDaemonPrefix) || wanted[st.Spec.ID] {
				continue
			}
			if err := p.opts.MPS.Stop(ctx, st.Spec.ID); err != nil {
				return nil, fmt.Errorf("stop the MPS daemon %s of a GPU no longer shared: %w", st.Spec.ID, err)
			}
		}
	}
	return daemons, nil
}

// buildSpec is the CDI spec of every underlying device of the resources:
// a GPU or MIG device, and for an MPS replica its GPU with its daemon's
// directories (gpu-0-mps).
func (p *Plugin) buildSpec(ctx context.Context, inv *hardware.Inventory, daemons map[string]mps.Daemon) (*cdispec.Spec, error) {
	seen := map[string]bool{}
	var devs []cdi.SpecDevice
	for _, r := range p.resources {
		for _, d := range r.Devices {
			if seen[d.CDIName()] {
				continue
			}
			seen[d.CDIName()] = true
			sd := cdi.SpecDevice{Device: d.Device}
			if d.MPS {
				sd.ShareID, sd.Edits = MPSShare, daemons[d.Device.GPU.UUID].ContainerEdits()
			}
			devs = append(devs, sd)
		}
	}
	common, err := p.opts.DriverEdits.CommonEdits(ctx, inv.DriverVersion)
	if err != nil {
		return nil, fmt.Errorf("driver files for the CDI spec: %w", err)
	}
	return cdi.BuildSpec(cdi.SpecInput{DriverName: p.opts.DriverName, Majors: inv.Majors, Devices: devs, Common: common})
}

// Resources are what the plugin serves.
func (p *Plugin) Resources() []Resource { return p.resources }

// CDISpec is the node-wide CDI spec the plugin wrote.
func (p *Plugin) CDISpec() *cdispec.Spec { return p.spec }

// Registrations is how many times the plugin registered all its resources.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registrations
}

// Run serves the resources until ctx ends: one socket per resource,
// registered with the kubelet; when the kubelet restarts (its socket is
// created again, and it removed ours), the servers start again and
// register anew. Health events from the hardware turn devices Unhealthy in
// ListAndWatch while their GPU has a fault the policy counts.
func (p *Plugin) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", p.opts.PluginDir, err)
	}
	defer watcher.Close()
	if err := watcher.Add(p.opts.PluginDir); err != nil {
		return fmt.Errorf("watch %s: %w", p.opts.PluginDir, err)
	}
	if hw, ok := p.opts.Hardware.(hardware.HealthWatcher); ok {
		go p.watchHealth(ctx, hw)
	}
	if p.opts.MPS != nil {
		// A daemon that dies is started again with its caps.
		go p.opts.MPS.Supervise(ctx, mpsSuperviseInterval)
	}
	defer p.stopServers()
	kubeletSock := filepath.Join(p.opts.PluginDir, filepath.Base(pluginapi.KubeletSocket))
	start := func() {
		if err := p.startAndRegister(ctx, kubeletSock); err != nil {
			logger.Error(err, "Cannot serve the device plugin's resources; trying again when the kubelet's socket is created again")
		}
	}
	start()
	retry := time.NewTicker(5 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return errors.New("watch of the device-plugin directory ended")
			}
			if ev.Name == kubeletSock && ev.Has(fsnotify.Create) {
				logger.Info("The kubelet's socket was created again (kubelet restart): serving and registering again")
				start()
			}
		case err, ok := <-watcher.Errors:
			if ok {
				logger.Error(err, "Watching the device-plugin directory")
			}
		case <-retry.C:
			// A registration that failed (kubelet not up yet) is retried,
			// and a socket of ours that someone removed is served again.
			if p.needsRestart() {
				start()
			}
		}
	}
}

// needsRestart reports whether a server's socket is gone or no
// registration succeeded since the servers started.
func (p *Plugin) needsRestart() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.servers) == 0 {
		return true
	}
	for _, s := range p.servers {
		if _, err := os.Stat(s.socket); err != nil {
			return true
		}
	}
	return false
}

// startAndRegister (re)starts every resource's server and registers it.
func (p *Plugin) startAndRegister(ctx context.Context, kubeletSock string) error {
	logger := klog.FromContext(ctx)
	p.stopServers()
	var servers []*resourceServer
	for _, r := range p.resources {
		s := newResourceServer(p, r)
		if err := s.serve(logger); err != nil {
			for _, s := range servers {
				s.stop()
			}
			return err
		}
		servers = append(servers, s)
	}
	p.mu.Lock()
	p.servers = servers
	p.mu.Unlock()
	for _, s := range servers {
		if err := p.register(ctx, kubeletSock, s); err != nil {
			p.stopServers()
			return err
		}
		logger.Info("Registered with the kubelet", "resource", s.res.Name, "socket", s.socket)
	}
	p.mu.Lock()
	p.registrations++
	p.mu.Unlock()
	return nil
}

func (p *Plugin) stopServers() {
	p.mu.Lock()
	servers := p.servers
	p.servers = nil
	p.mu.Unlock()
	for _, s := range servers {
		s.stop()
	}
}

// register calls the kubelet's Registration service for one resource.
func (p *Plugin) register(ctx context.Context, kubeletSock string, s *resourceServer) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RegisterTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix://"))
		}))
	if err != nil {
		return fmt.Errorf("connect to the kubelet at %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket),
		ResourceName: s.res.Name,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with the kubelet at %s: %w", s.res.Name, kubeletSock, err)
	}
	return nil
}

// healthy reports whether the GPU has no fault the policy counts.
func (p *Plugin) healthy(gpuUUID string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.health.Condition(gpuUUID).Healthy()
}

// watchHealth applies the hardware's health events and tells every
// ListAndWatch stream when a GPU's health changed.
func (p *Plugin) watchHealth(ctx context.Context, hw hardware.HealthWatcher) {
	logger := klog.FromContext(ctx)
	events := make(chan hardware.HealthEvent)
	done := make(chan error, 1)
	go func() { done <- hw.WatchHealth(ctx, events) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				logger.Error(err, "Cannot watch GPU health; devices stay Healthy")
			}
			return
		case e := <-events:
			p.mu.Lock()
			next, t := p.health.Apply(p.opts.HealthPolicy, e)
			p.health = next
			servers := p.servers
			p.mu.Unlock()
			if !t.Changed() {
				logger.V(2).Info("Health event changes nothing", "event", e.String())
				continue
			}
			logger.Info("GPU health changed", "event", e.String(), "before", t.Before.String(), "after", t.After.String())
			for _, s := range servers {
				s.healthChanged()
			}
		}
	}
}
