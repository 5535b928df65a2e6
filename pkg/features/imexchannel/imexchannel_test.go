package imexchannel_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimconfig"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const (
	driver = "compute-domain.nvidia.com"
	node   = "gb200-nvl72-00"
)

// domains is a fake [imexchannel.Channels]: the channel of each domain UID
// and its namespace.
type domains map[string]struct {
	namespace string
	channel   int
}

func (d domains) Channel(_ context.Context, namespace, id string) (int, error) {
	dom, ok := d[id]
	switch {
	case !ok:
		return 0, errors.New("no such ComputeDomain")
	case dom.namespace != namespace:
		return 0, fmt.Errorf("the ComputeDomain is in namespace %s, not the claim's", dom.namespace)
	}
	return dom.channel, nil
}

// fakeNode is the preparer's view of a node of the gb200-nvl72 fleet, its
// devices built as the channel plugin builds them, configs resolved as it
// resolves them.
type fakeNode struct {
	inv   *hardware.Inventory
	model *devicemodel.Model
}

func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	f, err := simfleet.Load("gb200-nvl72")
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	model, err := devicemodel.BuildComputeDomain(inv, devicemodel.ComputeDomainOptions{SharedChannel: true})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeNode{inv: inv, model: model}
}

func (n *fakeNode) Claim(_ context.Context, claim *resourceapi.ResourceClaim, intent claimstate.Intent) (*preparer.Claim, *cdispec.ContainerEdits, error) {
	kindOf := func(r resourceapi.DeviceRequestAllocationResult) (claimconfig.DeviceKind, error) {
		d, ok := n.model.Lookup(r.Device)
		if !ok {
			return "", errors.New("not published")
		}
		return claimconfig.DeviceKind(d.Kind), nil
	}
	resolved, err := claimconfig.Resolve(driver, claim, kindOf, v1beta1.Features{})
	if err != nil {
		return nil, nil, err
	}
	c := &preparer.Claim{UID: intent.UID, Namespace: intent.Namespace, Name: intent.Name, Inventory: n.inv}
	for i := range intent.Devices {
		d, _ := n.model.Lookup(intent.Devices[i].Name)
		c.Devices = append(c.Devices, &preparer.Device{State: &intent.Devices[i], Model: d, Config: resolved[i]})
	}
	return c, nil, nil
}

func (n *fakeNode) Allocated(context.Context) ([]preparer.AllocatedClaim, error) { return nil, nil }
func (n *fakeNode) Inventory() *hardware.Inventory                               { return n.inv }
func (n *fakeNode) Model() *devicemodel.Model                                    { return n.model }

type harness struct {
	prep   *preparer.Preparer
	cdiDir string
}

func newHarness(t *testing.T, chans imexchannel.Channels) *harness {
	t.Helper()
	return newDaemonHarness(t, chans, nil)
}

// newDaemonHarness is newHarness with the node's IMEX daemon d (nil: none).
func newDaemonHarness(t *testing.T, chans imexchannel.Channels, d imexchannel.Daemon) *harness {
	t.Helper()
	ctx := context.Background()
	dir, cdiDir := t.TempDir(), t.TempDir()
	bootID := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(bootID, []byte("b0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store, _, err := checkpoint.Open(ctx, dir, checkpoint.WithBootIDPath(bootID), checkpoint.WithPool(node),
		checkpoint.WithDriverName(driver), checkpoint.WithKnownRecords(imexchannel.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	writer, err := cdi.NewWriter(cdiDir, driver)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{cdiDir: cdiDir, prep: preparer.New(preparer.Config{
		DriverName: driver, NodeName: node, Store: store, CDI: writer, Node: newFakeNode(t),
		Configurators: []preparer.Configurator{preparer.Adapt[imexchannel.Record](imexchannel.New(chans, 0).WithDaemon(d))},
	})}
}

// channelClaim is a claim of channel-0 (a share of it) with a
// ComputeDomainChannelConfig; params "" means no config.
func channelClaim(uid, namespace, params string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: namespace, Name: "claim-" + uid}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "channel", Driver: driver, Pool: node,
			Device: devicemodel.ChannelName(0), ShareID: ptr.To(types.UID("share-" + uid))}},
	}}
	if params != "" {
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}},
		}}
	}
	return c
}

func channelConfig(domain, mode string) string {
	s := `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "` + domain + `"`
	if mode != "" {
		s += `, "allocationMode": "` + mode + `"`
	}
	return s + "}"
}

// channelNodes returns the device nodes the claim's CDI spec gives.
func (h *harness) channelNodes(t *testing.T, uid string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(h.cdiDir, "*"+uid+"*"))
	if err != nil || len(matches) != 1 {
		t.Fatalf("CDI spec of claim %s: %v %v", uid, matches, err)
	}
	data, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("spec %s: %v", matches[0], err)
	}
	var out []string
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			out = append(out, fmt.Sprintf("%s %s %d:%d", n.Path, n.Type, n.Major, n.Minor))
		}
	}
	for _, n := range spec.ContainerEdits.DeviceNodes {
		out = append(out, "common "+n.Path)
	}
	return out
}

// TestTwoDomainsOneNode: two domains' claims on one node get their own
// channels; a second pod of a domain gets the domain's channel again; a
// domain whose channel another holds is refused, and so is mode All next
// to another domain; unpreparing frees the channel.
func TestTwoDomainsOneNode(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, domains{
		"dom-a": {"team-a", 1}, "dom-b": {"team-b", 2}, "dom-c": {"team-c", 1}, "dom-d": {"team-d", 3},
	})
	prepare := func(c *resourceapi.ResourceClaim) error {
		_, err := h.prep.Prepare(ctx, c)
		return err
	}
	if err := prepare(channelClaim("a1", "team-a", channelConfig("dom-a", ""))); err != nil {
		t.Fatalf("domain a: %v", err)
	}
	if err := prepare(channelClaim("b1", "team-b", channelConfig("dom-b", "Single"))); err != nil {
		t.Fatalf("domain b: %v", err)
	}
	if err := prepare(channelClaim("a2", "team-a", channelConfig("dom-a", ""))); err != nil {
		t.Fatalf("domain a, second pod: %v", err)
	}
	want := map[string]string{"a1": "channel1 c 511:1", "a2": "channel1 c 511:1", "b1": "channel2 c 511:2"}
	for uid, w := range want {
		got := h.channelNodes(t, uid)
		if len(got) != 1 || !strings.HasSuffix(got[0], w) || !strings.HasPrefix(got[0], imexchannel.ChannelDir+"/") {
			t.Errorf("claim %s: device nodes %v, want only %s/%s", uid, got, imexchannel.ChannelDir, w)
		}
	}

	err := prepare(channelClaim("c1", "team-c", channelConfig("dom-c", "")))
	if err == nil || !strings.Contains(err.Error(), "channel 1 of this node serves domain dom-a") {
		t.Errorf("domain c on domain a's channel: %v", err)
	}
	err = prepare(channelClaim("d1", "team-d", channelConfig("dom-d", "All")))
	if err == nil || !strings.Contains(err.Error(), "allocation mode All") {
		t.Errorf("domain d with mode All beside others: %v", err)
	}
	if matches, _ := filepath.Glob(filepath.Join(h.cdiDir, "*c1*")); len(matches) != 0 {
		t.Errorf("a refused claim left CDI specs: %v", matches)
	}

	// Once domain a is gone from the node, domain c may take channel 1.
	for _, uid := range []string{"a1", "a2"} {
		if _, err := h.prep.Unprepare(ctx, kubeletplugin.NamespacedObject{UID: types.UID(uid)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := prepare(channelClaim("c1", "team-c", channelConfig("dom-c", ""))); err != nil {
		t.Errorf("domain c after domain a left: %v", err)
	}
}

// TestAllocationModeAll gives every channel to a domain alone on the node.
func TestAllocationModeAll(t *testing.T) {
	h := newHarness(t, domains{"dom-a": {"team-a", 5}})
	if _, err := h.prep.Prepare(context.Background(), channelClaim("a1", "team-a", channelConfig("dom-a", "All"))); err != nil {
		t.Fatal(err)
	}
	got := h.channelNodes(t, "a1")
	if len(got) != imexchannel.DefaultMaxChannels || got[0] != imexchannel.ChannelPath(0)+" c 511:0" ||
		got[len(got)-1] != fmt.Sprintf("%s c 511:%d", imexchannel.ChannelPath(2047), 2047) {
		t.Errorf("mode All: %d nodes, first %v", len(got), got[:min(2, len(got))])
	}
}

// TestBadChannelClaims: each refusal names what is wrong, and leaves no
// record and no CDI spec.
func TestBadChannelClaims(t *testing.T) {
	tests := map[string]struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		"no config": {channelClaim("x", "team-a", ""),
			"domainID: Required value: a channel claim needs a ComputeDomainChannelConfig naming its ComputeDomain's UID in domainID (default config gives none)"},
		"unknown domain": {channelClaim("x", "team-a", channelConfig("dom-z", "")), "domainID dom-z: no such ComputeDomain"},
		"other namespace": {channelClaim("x", "team-b", channelConfig("dom-a", "")),
			"domainID dom-a: the ComputeDomain is in namespace team-a, not the claim's"},
		"bad mode": {channelClaim("x", "team-a", channelConfig("dom-a", "Many")), `allocationMode: Unsupported value: "Many"`},
		"unknown field": {channelClaim("x", "team-a", `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainId": "dom-a"}`),
			`unknown field "domainId"`},
		"GPU config": {channelClaim("x", "team-a", `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}`),
			"a GpuConfig configures full GPUs only"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, domains{"dom-a": {"team-a", 1}})
			_, err := h.prep.Prepare(context.Background(), tc.claim)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Prepare = %v, want an error containing %q", err, tc.want)
			}
			if matches, _ := filepath.Glob(filepath.Join(h.cdiDir, "[^.]*")); len(matches) != 0 {
				t.Errorf("refused claim left %v", matches)
			}
		})
	}
}

// TestDaemonDevicesRefused: daemon devices are published (NVIDIA's class
// selects them) but not prepared through claims.
func TestDaemonDevicesRefused(t *testing.T) {
	h := newHarness(t, domains{})
	c := channelClaim("x", "team-a", `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": "dom-a"}`)
	c.Status.Allocation.Devices.Results[0].Device = devicemodel.DaemonName(0)
	c.Status.Allocation.Devices.Results[0].ShareID = nil
	_, err := h.prep.Prepare(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "IMEX daemon devices are not prepared by gpudra yet") {
		t.Errorf("Prepare = %v", err)
	}
}
