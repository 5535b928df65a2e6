package simnic

import (
	"context"
	"errors"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// Config describes the NIC driver of one node.
type Config struct {
	// DriverName defaults to DefaultDriverName.
	DriverName string
	// NodeName is the node's name, which is also the pool's.
	NodeName string
	// NICs are the node's NICs, defaults filled in (see sim.Resolve).
	NICs []sim.NIC
	// KubeClient publishes the slices and reads claims.
	KubeClient kubernetes.Interface
	// PluginDataDir holds the driver's DRA socket; RegistrarDir is the
	// kubelet's plugin registration directory; CDIDir is where the node's
	// container runtime reads CDI specs.
	PluginDataDir string
	RegistrarDir  string
	CDIDir        string
}

// Driver is a running NIC driver: the kubeletplugin helper serving the
// kubelet's DRA calls and publishing the node's NICs.
type Driver struct {
	cfg     Config
	devices []resourceapi.Device
	// index maps a device name to the NIC's index on the node.
	index  map[string]int
	cdi    *cdi.Writer
	helper *kubeletplugin.Helper
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Start starts the driver: it serves the DRA gRPC API, registers with the
// kubelet through RegistrarDir and publishes the node's NICs. It runs until
// Stop or until ctx is cancelled.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	devices, err := Devices(cfg.NICs)
	if err != nil {
		return nil, fmt.Errorf("NIC driver on node %s: %w", cfg.NodeName, err)
	}
	if err := os.MkdirAll(cfg.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("NIC driver on node %s: plugin data directory: %w", cfg.NodeName, err)
	}
	writer, err := cdi.NewWriter(cfg.CDIDir, cfg.DriverName)
	if err != nil {
		return nil, fmt.Errorf("NIC driver on node %s: %w", cfg.NodeName, err)
	}
	logger := klog.FromContext(ctx).WithName("nic-driver")
	ctx = klog.NewContext(ctx, logger)
	if removed, err := writer.RemoveStaleTemps(); err != nil {
		logger.Error(err, "Removing the temp files of interrupted CDI spec writes", "removed", removed)
	}
	d := &Driver{cfg: cfg, devices: devices, index: map[string]int{}, cdi: writer}
	for i, dev := range devices {
		d.index[dev.Name] = i
	}
	d.helper, err = kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		// Simulated NICs never fail: no health to report.
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("NIC driver on node %s: start kubelet plugin helper: %w", cfg.NodeName, err)
	}
	res, err := DriverResources(cfg.NodeName, cfg.NICs)
	if err == nil {
		err = d.helper.PublishResources(ctx, res)
	}
	if err != nil {
		d.helper.Stop()
		return nil, fmt.Errorf("NIC driver on node %s: publish: %w", cfg.NodeName, err)
	}
	logger.Info("NIC driver started", "node", cfg.NodeName, "nics", len(devices))
	return d, nil
}

// Stop stops serving and publishing; the slices stay until the kubelet
// removes them, as when a driver's pod goes.
func (d *Driver) Stop() { d.helper.Stop() }

// DriverName returns the driver's name.
func (d *Driver) DriverName() string { return d.cfg.DriverName }

// Devices returns the devices the driver publishes.
func (d *Driver) Devices() []resourceapi.Device { return d.devices }

// PrepareResourceClaims implements [kubeletplugin.DRAPlugin]: each claim's
// NICs get a CDI spec of their own, named after the claim, written again on
// every call (so a repeated call after a crash is answered the same way).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepare(claim)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(claim))
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return out, nil
}

func (d *Driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	uid := string(claim.UID)
	var devices []kubeletplugin.Device
	var nics []int
	seen := map[int]bool{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		i, ok := d.index[r.Device]
		if r.Pool != d.cfg.NodeName || !ok {
			return nil, fmt.Errorf("claim %s/%s: request %s: device %s of pool %s is not a NIC of node %s", claim.Namespace, claim.Name, r.Request, r.Device, r.Pool, d.cfg.NodeName)
		}
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{cdi.DeviceID(d.cfg.DriverName, uid, r.Device)},
		})
		if !seen[i] {
			seen[i] = true
			nics = append(nics, i)
		}
	}
	if len(nics) == 0 {
		return nil, nil
	}
	if err := d.cdi.Write(uid, buildSpec(d.cfg.DriverName, uid, nics)); err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return devices, nil
}

// UnprepareResourceClaims implements [kubeletplugin.DRAPlugin]: the
// claims' CDI specs go; a claim without one is done already.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.cdi.Remove(string(claim.UID))
		if out[claim.UID] != nil {
			klog.FromContext(ctx).Error(out[claim.UID], "Unprepare failed", "claim", claim.NamespacedName)
		}
	}
	return out, nil
}

// HandleError implements [kubeletplugin.DRAPlugin]: publishing errors are
// logged; the ResourceSlice controller retries.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg, "node", d.cfg.NodeName)
}

// errNoHealth is what WatchHealthStatus answers: the helper runs without
// the health service, so the kubelet does not call it.
var errNoHealth = errors.New("the simulated NIC driver reports no device health")

// WatchHealthStatus implements [kubeletplugin.DRAPlugin].
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return errNoHealth
}
