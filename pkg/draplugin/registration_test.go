package draplugin_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// getInfo asks the registration socket what the kubelet would learn.
func getInfo(t *testing.T, socket string) *registerapi.PluginInfo {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo on %s: %v", socket, err)
	}
	return info
}

// TestRegistration: the kubelet finds the plugin in its registration
// directory, as a DRA plugin of our driver name, serving DRA gRPC v1 on the
// advertised endpoint, with the device health service (KEP-4680) where the
// hardware reports health and without it where it does not.
func TestRegistration(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mutate     []func(*draplugin.Config)
		wantHealth bool
	}{
		{name: "hardware reports health", wantHealth: true},
		{name: "hardware without health", wantHealth: false, mutate: []func(*draplugin.Config){func(cfg *draplugin.Config) {
			cfg.Hardware = withoutHealth{cfg.Hardware}
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.mutate...)
			info := getInfo(t, filepath.Join(h.cfg.RegistrarDir, driverName+"-reg.sock"))
			if info.Type != registerapi.DRAPlugin || info.Name != driverName || info.Endpoint != h.draSocket() {
				t.Errorf("registration info: type %q name %q endpoint %q", info.Type, info.Name, info.Endpoint)
			}
			if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
				t.Errorf("supported versions %v lack %s", info.SupportedVersions, drapb.DRAPluginService)
			}
			if got := slices.Contains(info.SupportedVersions, drahealthv1.DRAResourceHealthService); got != tc.wantHealth {
				t.Errorf("supported versions %v: %s advertised %v, want %v", info.SupportedVersions, drahealthv1.DRAResourceHealthService, got, tc.wantHealth)
			}
		})
	}
}

// withoutHealth hides the hardware's health watcher.
type withoutHealth struct{ hardware.Hardware }

// TestDroppedFieldsAreReported: when the API server drops fields of a
// slice that no publishing choice falls back from, the plugin says which
// features it lacks. (Dropped device taints make unhealthy GPUs withdrawn:
// TestHealthWithoutDeviceTaints.)
func TestDroppedFieldsAreReported(t *testing.T) {
	h := newHarness(t)
	desired := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Devices: []resourceapi.Device{{Name: "gpu-0", BindingConditions: []string{"ready"}}},
	}}
	actual := desired.DeepCopy()
	actual.Spec.Devices[0].BindingConditions = nil
	err := &resourceslice.DroppedFieldsError{PoolName: nodeName, DesiredSlice: desired, ActualSlice: actual}
	h.driver.HandleError(h.ctx, err, "publishing")
	events, werr := h.waitForEvent("ResourceSliceFieldsDropped")
	if werr != nil {
		t.Fatal(werr)
	}
	if !strings.Contains(events, "DRADeviceBindingConditions") {
		t.Errorf("event does not name the missing feature: %s", events)
	}
}

// TestRollingUpdate: two plugin instances on the same directories, as
// during a DaemonSet rolling update, share the prepared claims through the
// checkpoint: what one prepared, the other refuses to give away and can
// unprepare.
func TestRollingUpdate(t *testing.T) {
	dir := shorttemp.Dir(t)
	old := newHarnessIn(t, dir, func(cfg *draplugin.Config) { cfg.RollingUpdateUID = "pod-old" })
	client := old.client
	next := newHarnessIn(t, dir, func(cfg *draplugin.Config) {
		cfg.RollingUpdateUID = "pod-new"
		cfg.KubeClient = client
	})
	for _, h := range []*harness{old, next} {
		socket := filepath.Join(h.cfg.RegistrarDir, filepath.Base(kubeletplugin.RollingUpdateRegistrarSocketFile(h.cfg.RegistrarDir, driverName, h.cfg.RollingUpdateUID)))
		if info := getInfo(t, socket); info.Endpoint != h.draSocket() {
			t.Errorf("%s registers endpoint %s, want %s", h.cfg.RollingUpdateUID, info.Endpoint, h.draSocket())
		}
	}

	claim := old.claim("gpu-4")
	prepared := old.mustPrepare(claim)
	// The new instance answers the same claim from the shared record.
	again := next.mustPrepare(claim)
	if !slices.Equal(again.Devices[0].CdiDeviceIds, prepared.Devices[0].CdiDeviceIds) {
		t.Errorf("new instance answered %v, old %v", again.Devices, prepared.Devices)
	}
	// Neither instance gives the device to another claim.
	other := next.claimFor("rival", "rival", "gpu-4")
	if r := next.prepare(other).Claims["rival"]; !strings.Contains(r.Error, "already prepared") {
		t.Errorf("new instance gave gpu-4 to a second claim: %q", r.Error)
	}
	// The new instance unprepares what the old one prepared.
	next.mustUnprepare(claim)
	if files := old.specFiles(); len(files) != 0 {
		t.Errorf("specs left: %v", files)
	}
	if strings.Contains(old.checkpoint(), string(claim.UID)) {
		t.Errorf("record left: %s", old.checkpoint())
	}
}

// deadSocket leaves a Unix socket at path that no process serves, as an
// instance killed by SIGKILL leaves its sockets.
func deadSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStaleSocketsRemoved: the sockets of a rolling-update instance killed
// by SIGKILL (its DRA socket and registration socket) are removed by the
// next instance on the node; the sockets of a live instance, another
// driver's and files that are not sockets are left alone.
func TestStaleSocketsRemoved(t *testing.T) {
	dir := shorttemp.Dir(t)
	live := newHarnessIn(t, dir, func(cfg *draplugin.Config) { cfg.RollingUpdateUID = "pod-live" })
	registry, data := live.cfg.RegistrarDir, live.cfg.PluginDataDir
	killed := []string{
		filepath.Join(data, "dra-pod-killed.sock"),
		filepath.Join(registry, kubeletplugin.RollingUpdateRegistrarSocketFile(registry, driverName, "pod-killed")),
		filepath.Join(registry, driverName+"-reg.sock"), // an instance without rolling updates
	}
	for _, path := range killed {
		deadSocket(t, path)
	}
	othersDead := filepath.Join(registry, "other.example.com-pod-killed-reg.sock")
	deadSocket(t, othersDead)
	notSocket := filepath.Join(data, "dra-notes.sock")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	liveReg := filepath.Join(registry, kubeletplugin.RollingUpdateRegistrarSocketFile(registry, driverName, "pod-live"))

	next := newHarnessIn(t, dir, func(cfg *draplugin.Config) {
		cfg.RollingUpdateUID = "pod-next"
		cfg.KubeClient = live.client
	})
	for _, path := range killed {
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stale socket %s left behind (%v)", filepath.Base(path), err)
		}
	}
	for _, path := range []string{othersDead, notSocket, liveReg, live.draSocket()} {
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("%s removed: %v", filepath.Base(path), err)
		}
	}
	// Both instances still serve.
	for _, h := range []*harness{live, next} {
		socket := filepath.Join(registry, kubeletplugin.RollingUpdateRegistrarSocketFile(registry, driverName, h.cfg.RollingUpdateUID))
		if info := getInfo(t, socket); info.Endpoint != h.draSocket() {
			t.Errorf("%s registers endpoint %s, want %s", h.cfg.RollingUpdateUID, info.Endpoint, h.draSocket())
		}
	}
	claim := live.claim("gpu-2")
	live.mustPrepare(claim)
	next.mustUnprepare(claim)
}
