// Package baseline is a minimal DRA driver for the local cluster's load
// run: the yardstick gpudra is measured against. On the same kubeletplugin
// helper as gpudra, it publishes the devices and counter sets it is given
// (gpudra's, built with gpudra's device model) under its own driver name,
// and prepares a claim by writing a CDI spec that sets one environment
// variable per device, nothing else: no checkpoint, no device setup, no
// checks. What a Prepare costs beyond it is what gpudra's own work costs.
//
// It lives in the local-cluster module, never in the gpudra binary.
package baseline

import (
	"context"
	"fmt"
	"os"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
)

// DeviceEnv is the environment variable a prepared device sets in the
// container: its name in the pool.
const DeviceEnv = "BASELINE_DEVICE"

// Config is what a Driver runs with.
type Config struct {
	// DriverName is the baseline's driver name, not gpudra's.
	DriverName string
	// NodeName is the node and the name of its pool.
	NodeName   string
	KubeClient kubernetes.Interface
	// PluginDataDir holds the DRA socket; RegistrarDir is where the
	// kubelet looks for registration sockets; CDIDir is where specs go.
	PluginDataDir, RegistrarDir, CDIDir string
	// Resources are the pool to publish: devices and counter sets.
	Resources resourceslice.DriverResources
}

// Driver is the baseline kubelet plugin. It implements
// [kubeletplugin.DRAPlugin].
type Driver struct {
	cfg    Config
	cdi    *cdi.Writer
	helper *kubeletplugin.Helper
}

var _ kubeletplugin.DRAPlugin = &Driver{}

// Start registers the driver with the kubelet, serves DRA gRPC and
// publishes cfg.Resources. Stop ends it.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.DriverName == "" || cfg.NodeName == "" {
		return nil, fmt.Errorf("baseline driver: DriverName and NodeName are required")
	}
	if err := os.MkdirAll(cfg.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("baseline driver: %w", err)
	}
	w, err := cdi.NewWriter(cfg.CDIDir, cfg.DriverName)
	if err != nil {
		return nil, fmt.Errorf("baseline driver: %w", err)
	}
	d := &Driver{cfg: cfg, cdi: w}
	d.helper, err = kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		// As gpudra runs it: claims of one call are not serialized.
		kubeletplugin.Serialize(false),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("baseline driver: start kubelet plugin helper: %w", err)
	}
	if err := d.helper.PublishResources(ctx, cfg.Resources); err != nil {
		d.helper.Stop()
		return nil, fmt.Errorf("baseline driver: publish ResourceSlices: %w", err)
	}
	return d, nil
}

// Stop stops serving; the published slices stay, as a plugin's do when it
// exits.
func (d *Driver) Stop() { d.helper.Stop() }

// PrepareResourceClaims implements [kubeletplugin.DRAPlugin]: one
// env-only CDI spec per claim.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepare(claim)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(claim))
			out[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)}
			continue
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

func (d *Driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim is not allocated")
	}
	uid := string(claim.UID)
	spec := &cdispec.Spec{Version: cdi.SpecVersion, Kind: cdi.Kind(d.cfg.DriverName)}
	devices := []kubeletplugin.Device{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		name := cdi.DeviceName(uid, r.Device)
		if !containsDevice(spec, name) {
			spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: cdispec.ContainerEdits{Env: []string{DeviceEnv + "=" + r.Device}}})
		}
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{cdi.DeviceID(d.cfg.DriverName, uid, r.Device)},
		})
	}
	if len(spec.Devices) == 0 {
		return devices, nil
	}
	if err := d.cdi.Write(uid, spec); err != nil {
		return nil, err
	}
	return devices, nil
}

func containsDevice(spec *cdispec.Spec, name string) bool {
	for _, d := range spec.Devices {
		if d.Name == name {
			return true
		}
	}
	return false
}

// UnprepareResourceClaims implements [kubeletplugin.DRAPlugin]: the
// claim's spec is removed; a claim never prepared here succeeds.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.cdi.Remove(string(c.UID))
	}
	return out, nil
}

// HandleError implements [kubeletplugin.DRAPlugin]: errors of the
// background publishing are logged.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, strings.TrimSpace(msg))
}

// WatchHealthStatus implements [kubeletplugin.DRAPlugin]. The helper runs
// with its health service off, so it is never called.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
