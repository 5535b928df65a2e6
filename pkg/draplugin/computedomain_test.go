package draplugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/hardware"
)

const cdDriverName = "compute-domain.nvidia.com"

// cdHarness runs the shell as the ComputeDomain channel plugin on a node
// of the gb200-nvl72 fleet, reading domains' channels from a fake API
// server's ComputeDomains.
type cdHarness struct {
	*harness
	domains *dynamicfake.FakeDynamicClient
}

func newCDHarness(t *testing.T, domains ...*v1beta1.ComputeDomain) *cdHarness {
	t.Helper()
	return newCDHarnessWith(t, domains)
}

// newCDHarnessWith is newCDHarness with more changes to the plugin's
// configuration, applied after the fleet's.
func newCDHarnessWith(t *testing.T, domains []*v1beta1.ComputeDomain, mutate ...func(*draplugin.Config)) *cdHarness {
	t.Helper()
	var objs []runtime.Object
	for _, d := range domains {
		objs = append(objs, domainObject(t, d))
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{computedomain.GVR: "ComputeDomainList"}, objs...)
	h := newHarness(t, append([]func(*draplugin.Config){withFleet(t, "gb200-nvl72", "gb200-nvl72-00"), func(cfg *draplugin.Config) {
		cfg.DriverName = cdDriverName
		cfg.Features = func(draplugin.FeatureEnv) (*features.Set, error) {
			return features.NewComputeDomain(features.ComputeDomainOptions{
				Channels: &computedomain.APIChannels{Client: dyn}, SharedChannel: true,
			}), nil
		}
	}}, mutate...)...)
	return &cdHarness{harness: h, domains: dyn}
}

func domainObject(t *testing.T, d *v1beta1.ComputeDomain) *unstructured.Unstructured {
	t.Helper()
	d.APIVersion, d.Kind = v1beta1.SchemeGroupVersion.String(), v1beta1.ComputeDomainKind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func domain(namespace, name, uid string, channel *int32) *v1beta1.ComputeDomain {
	return &v1beta1.ComputeDomain{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid)},
		Spec:       v1beta1.ComputeDomainSpec{Channel: &v1beta1.ComputeDomainChannelSpec{ResourceClaimTemplate: v1beta1.ComputeDomainResourceClaimTemplate{Name: name + "-channel"}}},
		Status:     v1beta1.ComputeDomainStatus{Channel: channel},
	}
}

func ch(n int32) *int32 { return &n }

// channelClaim creates an allocated claim of channel-0 configured, as the
// controller's ResourceClaimTemplate configures it, with the domain's UID.
func (h *cdHarness) channelClaim(namespace, name, domainUID string) *resourceapi.ResourceClaim {
	h.tb.Helper()
	n := h.claimNo.Add(1)
	uid := types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", n))
	// channel-0 allows multiple allocations: the allocator gives each
	// claim a share of it.
	share := types.UID(fmt.Sprintf("share-%d", n))
	params := fmt.Sprintf(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainChannelConfig","domainID":%q}`, domainUID)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "channel", Driver: cdDriverName, Pool: h.cfg.NodeName, Device: "channel-0", ShareID: &share}},
				Config: []resourceapi.DeviceAllocationConfiguration{{
					Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"channel"},
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
						Driver: cdDriverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
					}},
				}},
			}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-of-" + name, UID: "pod-uid-of-" + uid}},
		},
	}
	return h.create(claim)
}

// channelNodes returns the device nodes the claim's CDI spec gives its
// containers.
func (h *cdHarness) channelNodes(claim *resourceapi.ResourceClaim) []string {
	h.tb.Helper()
	var out []string
	for _, f := range h.specFiles() {
		if !strings.Contains(f, string(claim.UID)) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(h.cfg.CDIDir, f))
		if err != nil {
			h.tb.Fatal(err)
		}
		var spec cdispec.Spec
		if err := json.Unmarshal(data, &spec); err != nil {
			h.tb.Fatal(err)
		}
		for _, d := range spec.Devices {
			for _, n := range d.ContainerEdits.DeviceNodes {
				out = append(out, fmt.Sprintf("%s c %d:%d", n.Path, n.Major, n.Minor))
			}
		}
	}
	return out
}

func TestComputeDomainPublishesChannelAndDaemon(t *testing.T) {
	h := newCDHarness(t)
	var names []string
	for _, d := range h.driver.Devices() {
		names = append(names, d.Name)
		if d.Name == "channel-0" && (d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations) {
			t.Errorf("channel-0 is not shared: %+v", d)
		}
	}
	if want := []string{"channel-0", "daemon-0"}; !slices.Equal(names, want) {
		t.Fatalf("devices %v, want %v", names, want)
	}
	// The published slice is the channel driver's, in the node's pool.
	var list *resourceapi.ResourceSliceList
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		list, err = h.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) > 0, err
	})
	if err != nil || len(list.Items) != 1 || list.Items[0].Spec.Driver != cdDriverName || len(list.Items[0].Spec.Devices) != 2 {
		t.Fatalf("ResourceSlices: %v %+v", err, list)
	}
}

// fabricSwitch is a node's hardware whose GPUs report no NVLink fabric
// until the fabric is switched on, as on a node whose fabric manager
// starts after the plugin.
type fabricSwitch struct {
	hardware.Hardware
	on atomic.Bool
}

// Discover implements [hardware.Hardware].
func (f *fabricSwitch) Discover(ctx context.Context) (*hardware.Inventory, error) {
	inv, err := f.Hardware.Discover(ctx)
	if err != nil || f.on.Load() {
		return inv, err
	}
	inv.GPUs = slices.Clone(inv.GPUs)
	for i := range inv.GPUs {
		inv.GPUs[i].Fabric = nil
	}
	return inv, nil
}

// TestComputeDomainNoFabricPublishesNothing: a node that cannot join a
// domain offers no channel (a pod allocated one there would be stuck in
// ContainerCreating) and logs why; once discovery finds the fabric the
// node offers its channel and daemon.
func TestComputeDomainNoFabricPublishesNothing(t *testing.T) {
	var hw *fabricSwitch
	h := newCDHarnessWith(t, nil, func(cfg *draplugin.Config) {
		hw = &fabricSwitch{Hardware: cfg.Hardware}
		cfg.Hardware = hw
		cfg.DiscoveryInterval = 20 * time.Millisecond
	})
	published := func(want int) {
		t.Helper()
		var devices []string
		err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			list, err := h.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			devices = nil
			for _, s := range list.Items {
				for _, d := range s.Spec.Devices {
					devices = append(devices, d.Name)
				}
			}
			return len(list.Items) > 0 && len(devices) == want, nil
		})
		if err != nil {
			t.Fatalf("published devices %v, want %d: %v", devices, want, err)
		}
	}
	published(0)
	if n := len(h.driver.Devices()); n != 0 {
		t.Errorf("%d devices without a fabric, want none", n)
	}
	if logs := h.logs(); !strings.Contains(logs, "NoNVLinkFabric") || !strings.Contains(logs, "cannot join a ComputeDomain") {
		t.Errorf("the plugin does not log why it offers no channel:\n%s", logs)
	}

	hw.on.Store(true)
	published(2)
}

func TestComputeDomainPrepare(t *testing.T) {
	h := newCDHarness(t,
		domain("default", "a", "uid-a", ch(3)),
		domain("default", "b", "uid-b", ch(5)),
		domain("default", "unassigned", "uid-c", nil),
		domain("other", "d", "uid-d", ch(7)),
	)
	a1 := h.channelClaim("default", "a1", "uid-a")
	a2 := h.channelClaim("default", "a2", "uid-a")
	b1 := h.channelClaim("default", "b1", "uid-b")

	first := h.mustPrepare(a1)
	if got, want := h.channelNodes(a1), []string{"/dev/nvidia-caps-imex-channels/channel3 c 511:3"}; !slices.Equal(got, want) {
		t.Errorf("claim of domain a: device nodes %v, want %v", got, want)
	}
	writes := h.driver.CheckpointWrites()
	again := h.mustPrepare(a1)
	if !slices.Equal(first.Devices[0].CdiDeviceIds, again.Devices[0].CdiDeviceIds) || h.driver.CheckpointWrites() != writes {
		t.Errorf("re-prepare is not idempotent: %v then %v, checkpoint writes %d then %d", first.Devices, again.Devices, writes, h.driver.CheckpointWrites())
	}
	h.mustPrepare(a2)
	h.mustPrepare(b1)
	if got, want := h.channelNodes(a2), []string{"/dev/nvidia-caps-imex-channels/channel3 c 511:3"}; !slices.Equal(got, want) {
		t.Errorf("second pod of domain a: %v, want %v", got, want)
	}
	if got, want := h.channelNodes(b1), []string{"/dev/nvidia-caps-imex-channels/channel5 c 511:5"}; !slices.Equal(got, want) {
		t.Errorf("domain b on the same node: %v, want %v", got, want)
	}

	for _, tc := range []struct {
		name, namespace, domainUID, want string
	}{
		{"no channel yet", "default", "uid-c", "status.channel is unset"},
		{"another namespace's domain", "default", "uid-d", "no ComputeDomain with this UID in namespace default"},
		{"no such domain", "default", "uid-gone", "no ComputeDomain with this UID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := h.channelClaim(tc.namespace, strings.ReplaceAll(tc.name, " ", "-"), tc.domainUID)
			r := h.prepare(claim).Claims[string(claim.UID)]
			if r == nil || !strings.Contains(r.Error, tc.want) || !strings.Contains(r.Error, "domainID "+tc.domainUID) {
				t.Errorf("prepare: %+v, want an error naming domainID %s and %q", r, tc.domainUID, tc.want)
			}
			if nodes := h.channelNodes(claim); len(nodes) != 0 {
				t.Errorf("refused claim left a spec: %v", nodes)
			}
		})
	}

	// A domain whose channel changed (two controllers wrote) gets no claim
	// onto a node where it holds another channel, or where its new channel
	// serves another domain: both hold here.
	if _, err := h.domains.Resource(computedomain.GVR).Namespace("default").Update(context.Background(), domainObject(t, domain("default", "b", "uid-b", ch(3))), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b2 := h.channelClaim("default", "b2", "uid-b")
	if r := h.prepare(b2).Claims[string(b2.UID)]; r == nil || !strings.Contains(r.Error, "channel 3 of this node serves domain uid-a") && !strings.Contains(r.Error, "domain uid-b holds channel 5 on this node") {
		t.Errorf("claim of b after its channel changed: %+v", r)
	}

	// A restart keeps what is prepared: the same answers, no new work.
	h.restart()
	if got := h.mustPrepare(a1); !slices.Equal(first.Devices[0].CdiDeviceIds, got.Devices[0].CdiDeviceIds) {
		t.Errorf("after restart: %v, want %v", got.Devices, first.Devices)
	}
	if got, want := h.channelNodes(b1), []string{"/dev/nvidia-caps-imex-channels/channel5 c 511:5"}; !slices.Equal(got, want) {
		t.Errorf("after restart, domain b: %v, want %v", got, want)
	}

	for _, c := range []*resourceapi.ResourceClaim{a1, a2, b1} {
		h.mustUnprepare(c)
		if nodes := h.channelNodes(c); len(nodes) != 0 {
			t.Errorf("unprepared claim %s left its spec: %v", c.Name, nodes)
		}
	}
	h.mustUnprepare(a1) // idempotent
	if strings.Contains(h.checkpoint(), "uid-a") || strings.Contains(h.checkpoint(), "uid-b\"") {
		t.Errorf("checkpoint still holds the domains: %s", h.checkpoint())
	}
	// Domain b's channel on the node is free once its claims are gone: it
	// may now take channel 3.
	h.mustPrepare(b2)
	if got, want := h.channelNodes(b2), []string{"/dev/nvidia-caps-imex-channels/channel3 c 511:3"}; !slices.Equal(got, want) {
		t.Errorf("domain b after its claims left: %v, want %v", got, want)
	}
}

// TestComputeDomainCheckpointLost: after the checkpoint is lost, the
// channel a domain holds on the node is adopted from its claim's CDI spec,
// so the guard still keeps another domain off that channel.
func TestComputeDomainCheckpointLost(t *testing.T) {
	h := newCDHarness(t, domain("default", "a", "uid-a", ch(3)), domain("default", "b", "uid-b", ch(3)))
	a1 := h.channelClaim("default", "a1", "uid-a")
	h.mustPrepare(a1)
	h.stop()
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	h.start()
	if !strings.Contains(h.checkpoint(), "uid-a") {
		t.Errorf("adopted checkpoint lacks domain a's channel record: %s", h.checkpoint())
	}
	b1 := h.channelClaim("default", "b1", "uid-b")
	if r := h.prepare(b1).Claims[string(b1.UID)]; r == nil || !strings.Contains(r.Error, "channel 3 of this node serves domain uid-a") {
		t.Errorf("domain b on domain a's channel after the checkpoint was lost: %+v", r)
	}
	if got, want := h.channelNodes(a1), []string{"/dev/nvidia-caps-imex-channels/channel3 c 511:3"}; !slices.Equal(got, want) {
		t.Errorf("domain a's spec after adoption: %v, want %v", got, want)
	}
}

// TestComputeDomainWaitsForFabric: a GB200 tray booting with Fabric
// Manager still registering its GPUs (a fleet whose fabric completes after
// a delay) publishes no channel, says what it waits for, and publishes
// channel and daemon within seconds of the registration completing, long
// before its discovery interval: no error exit, no crash loop.
func TestComputeDomainWaitsForFabric(t *testing.T) {
	const fleet = `nodes:
- name: gb200-boot
  fabric: {cliqueID: 1, state: InProgress, completesAfter: 500ms}
  gpus:
  - model: GB200
  - model: GB200
`
	h := newCDHarnessWith(t, nil, withFleet(t, fleet, "gb200-boot"), func(cfg *draplugin.Config) {
		cfg.DiscoveryInterval = time.Hour
	})
	if n := len(h.driver.Devices()); n != 0 {
		t.Errorf("%d devices while the fabric registers, want none", n)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(h.driver.Devices()) == 2, nil
	})
	if err != nil {
		t.Fatalf("devices %d after the fabric completed, want channel-0 and daemon-0 within seconds: %v", len(h.driver.Devices()), err)
	}
	logs := h.logs()
	for _, want := range []string{"NVLinkFabricPending", "waiting for the GPUs' NVLink fabric registration to complete", "GPU 1 (", ") InProgress"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the plugin does not log %q while it waits:\n%s", want, logs)
		}
	}
}
