package devicemodel_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/allocation"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// shareAllocators are the allocator implementations that support
// consumable capacity; "stable" does not.
var shareAllocators = []string{"incubating", "experimental"}

// shareFeatureSets are the scheduler's DRA features that matter here, as
// Kubernetes enables them by default: consumable capacity is beta and on
// since 1.36, fractional capacity ranges since 1.37.
var shareFeatureSets = map[string]structured.Features{
	"1.36": {PartitionableDevices: true, ConsumableCapacity: true},
	"1.37": {PartitionableDevices: true, ConsumableCapacity: true, FractionalCapacityRange: true},
}

// shareNode is one node's published slices and the claims allocated from
// them, fed to the scheduler's own allocator one claim at a time.
type shareNode struct {
	t        *testing.T
	features structured.Features
	model    *devicemodel.Model
	slices   []*resourceapi.ResourceSlice
	classes  allocation.Classes
	cel      *cel.Cache
	live     map[string]*resourceapi.AllocationResult // by claim name
	seq      int
}

func newShareNode(t *testing.T, features structured.Features, inv *hardware.Inventory, opts ...devicemodel.Option) *shareNode {
	t.Helper()
	m, err := devicemodel.Build(inv, opts...)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	classes, err := deviceclasses.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range validatePool(m.Slices()) {
		t.Errorf("published slices: %v", err)
	}
	return &shareNode{
		t: t, features: features, model: m, slices: resourceSlices("node-0", m.DriverResources("node-0")),
		classes: allocation.Classes(classes), cel: cel.NewCache(100, cel.Features{}),
		live: map[string]*resourceapi.AllocationResult{},
	}
}

// allocate runs the allocator for claim and keeps the result as live; nil
// when the claim does not fit.
func (n *shareNode) allocate(claim *resourceapi.ResourceClaim) *resourceapi.AllocationResult {
	n.t.Helper()
	ctx := context.Background()
	live := make([]*resourceapi.AllocationResult, 0, len(n.live))
	for _, name := range slices.Sorted(maps.Keys(n.live)) {
		live = append(live, n.live[name])
	}
	result, err := allocation.Allocate(ctx, n.features, n.classes, n.cel, n.slices, live, "node-0", claim)
	if err != nil {
		n.t.Fatalf("Allocate %s: %v", claim.Name, err)
	}
	if result == nil {
		return nil
	}
	n.live[claim.Name] = result
	return result
}

// release drops a live claim; false if it was not allocated.
func (n *shareNode) release(claim string) bool {
	_, ok := n.live[claim]
	delete(n.live, claim)
	return ok
}

// claim makes a claim from the spec of a ResourceClaimTemplate in YAML,
// as the resource claim controller makes one for each pod.
func (n *shareNode) claim(template string) *resourceapi.ResourceClaim {
	n.t.Helper()
	var tmpl resourceapi.ResourceClaimTemplate
	if err := yaml.UnmarshalStrict([]byte(template), &tmpl); err != nil {
		n.t.Fatalf("claim template: %v", err)
	}
	// The API server's defaults (k8s.io/kubernetes pkg/apis/resource/v1
	// defaults.go): one device unless a request says otherwise.
	for _, r := range tmpl.Spec.Spec.Devices.Requests {
		if e := r.Exactly; e != nil && e.AllocationMode == "" {
			e.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			if e.Count == 0 {
				e.Count = 1
			}
		}
	}
	n.seq++
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", n.seq), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", n.seq))},
		Spec:       tmpl.Spec.Spec,
	}
}

// gpuTemplate is a ResourceClaimTemplate with one request for a device of
// the gpu.nvidia.com class, in the shape of NVIDIA's consumable-shares
// examples: capacity requests only when given, e.g. "memory: 4Gi".
func gpuTemplate(capacity ...string) string {
	t := `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-share
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
`
	if len(capacity) > 0 {
		t += "          capacity:\n            requests:\n"
		for _, c := range capacity {
			t += "              " + c + "\n"
		}
	}
	return t
}

// migTemplate asks for one MIG device of a profile.
func migTemplate(profile string) string {
	return fmt.Sprintf(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: mig
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: device.attributes['gpu.nvidia.com'].profile == '%s'
`, profile)
}

// vfioTemplate asks for one GPU for passthrough.
const vfioTemplate = `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: vfio
spec:
  spec:
    devices:
      requests:
      - name: vm
        exactly:
          deviceClassName: vfio.gpu.nvidia.com
`

// forEachAllocator runs f once per allocator that supports sharing and
// feature set.
func forEachAllocator(t *testing.T, f func(t *testing.T, features structured.Features)) {
	for _, impl := range shareAllocators {
		for _, version := range slices.Sorted(maps.Keys(shareFeatureSets)) {
			t.Run(impl+"/"+version, func(t *testing.T) {
				structured.EnableAllocators(impl)
				t.Cleanup(func() { structured.EnableAllocators() })
				f(t, shareFeatureSets[version])
			})
		}
	}
}

// checkShare fails unless result is one share of device with exactly the
// consumed capacity want (values as quantities), and returns its limits.
func checkShare(t *testing.T, n *shareNode, result *resourceapi.AllocationResult, device string, want map[string]string) devicemodel.ShareLimits {
	t.Helper()
	if len(result.Devices.Results) != 1 {
		t.Fatalf("%d devices allocated, want 1", len(result.Devices.Results))
	}
	r := result.Devices.Results[0]
	if r.Device != device || r.ShareID == nil || *r.ShareID == "" {
		t.Fatalf("allocated %s with share ID %v, want a share of %s", r.Device, r.ShareID, device)
	}
	got := map[string]string{}
	for name, q := range r.ConsumedCapacity {
		got[string(name)] = q.String()
	}
	for name, w := range want {
		if q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(name)]; !ok || q.Cmp(resource.MustParse(w)) != 0 {
			t.Errorf("%s: consumed %v, want %s %s", device, got, name, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: consumed %v, want exactly %v", device, got, want)
	}
	d, ok := n.model.Lookup(r.Device)
	if !ok {
		t.Fatalf("allocated device %s is not published", r.Device)
	}
	limits, err := d.ShareLimits(r.ConsumedCapacity)
	if err != nil {
		t.Errorf("ShareLimits: %v", err)
	}
	return limits
}

// TestMemorySharesFillAGPU: on every simulated model, four claims that
// each ask for a quarter of the published memory, rounded down, share one
// GPU, and a fifth finds no room. Each share's limits are its memory, with
// compute uncapped.
func TestMemorySharesFillAGPU(t *testing.T) {
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		for _, model := range sim.ModelNames() {
			t.Run(model, func(t *testing.T) {
				n := newShareNode(t, features, inventoryOf(simGPU(t, 0, model, false)), devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}))
				published := n.model.Devices[0].API.Capacity[devicemodel.CapMemory].Value
				quarter := published.Value() / 4
				shareIDs := sets.New[types.UID]()
				for i := range 4 {
					res := n.allocate(n.claim(gpuTemplate(fmt.Sprintf("memory: %q", fmt.Sprint(quarter)))))
					if res == nil {
						t.Fatalf("claim %d of 4 for %d bytes of %s found no room", i+1, quarter, published.String())
					}
					limits := checkShare(t, n, res, "gpu-0", map[string]string{"memory": fmt.Sprint(quarter), "compute": "0"})
					if limits != (devicemodel.ShareLimits{PinnedMemoryBytes: quarter}) {
						t.Errorf("limits %+v, want %d bytes and compute uncapped", limits, quarter)
					}
					shareIDs.Insert(*res.Devices.Results[0].ShareID)
				}
				if shareIDs.Len() != 4 {
					t.Errorf("%d distinct share IDs for 4 shares", shareIDs.Len())
				}
				if res := n.allocate(n.claim(gpuTemplate(fmt.Sprintf("memory: %q", fmt.Sprint(quarter))))); res != nil {
					t.Errorf("a fifth quarter was allocated: %+v", res.Devices.Results)
				}
			})
		}
	})
}

// step is one claim of an allocation sequence, or, with release set, the
// release of an earlier claim (by its 1-based position in the sequence).
type step struct {
	template string
	device   string            // "": the claim must not fit
	consumed map[string]string // for shares: the consumed capacity
	release  int
}

// runSteps allocates and releases as steps say, checking every outcome.
func runSteps(t *testing.T, n *shareNode, steps []step) {
	t.Helper()
	names := map[int]string{}
	for i, s := range steps {
		if s.release > 0 {
			if !n.release(names[s.release]) {
				t.Fatalf("step %d: step %d allocated nothing to release", i+1, s.release)
			}
			continue
		}
		claim := n.claim(s.template)
		names[i+1] = claim.Name
		res := n.allocate(claim)
		switch {
		case s.device == "" && res != nil:
			t.Fatalf("step %d: allocated %+v, want no room", i+1, res.Devices.Results)
		case s.device == "":
		case res == nil:
			t.Fatalf("step %d: no room, want %s", i+1, s.device)
		case s.consumed != nil:
			checkShare(t, n, res, s.device, s.consumed)
		case res.Devices.Results[0].Device != s.device || res.Devices.Results[0].ShareID != nil:
			t.Fatalf("step %d: allocated %s (share %v), want all of %s", i+1, res.Devices.Results[0].Device, res.Devices.Results[0].ShareID, s.device)
		}
	}
}

func TestMemoryComputeSharing(t *testing.T) {
	mc := devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute})
	all := map[string]string{"memory": "81559Mi", "compute": "0"}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a claim that asks for nothing holds the whole GPU", []step{
			{template: gpuTemplate(), device: "gpu-0", consumed: all},
			{template: gpuTemplate("memory: 1Mi")},
			{release: 1},
			{template: gpuTemplate("memory: 1Mi"), device: "gpu-0", consumed: map[string]string{"memory": "1Mi", "compute": "0"}},
			{template: gpuTemplate()},
		}},
		{"NVIDIA's memory manifests: 4Gi each", []step{
			{template: gpuTemplate("memory: 4Gi"), device: "gpu-0", consumed: map[string]string{"memory": "4Gi", "compute": "0"}},
			{template: gpuTemplate("memory: 4Gi"), device: "gpu-0", consumed: map[string]string{"memory": "4Gi", "compute": "0"}},
		}},
		{"compute is budgeted", []step{
			{template: gpuTemplate("memory: 1Gi", "compute: 60"), device: "gpu-0", consumed: map[string]string{"memory": "1Gi", "compute": "60"}},
			{template: gpuTemplate("memory: 1Gi", "compute: 41")},
			{template: gpuTemplate("memory: 1Gi", "compute: 40"), device: "gpu-0", consumed: map[string]string{"memory": "1Gi", "compute": "40"}},
			{template: gpuTemplate("memory: 1Gi"), device: "gpu-0", consumed: map[string]string{"memory": "1Gi", "compute": "0"}},
		}},
		{"requests are rounded up to the policy", []step{
			{template: gpuTemplate("memory: 1Ki", "compute: 2500m"), device: "gpu-0", consumed: map[string]string{"memory": "1Mi", "compute": "3"}},
		}},
		{"out of policy", []step{
			{template: gpuTemplate("memory: 81560Mi")},
			{template: gpuTemplate("compute: 101")},
			{template: gpuTemplate("shares: 1")},
		}},
	}
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				runSteps(t, newShareNode(t, features, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", false)), mc), tt.steps)
			})
		}
	})
}

// TestIntegerShares: N claims made from NVIDIA's integer-shares manifest
// (no capacity requests) share a GPU cut into N shares, one more finds no
// room, and a claim asking for several shares takes them.
func TestIntegerShares(t *testing.T) {
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		for _, shares := range []int{1, 2, 4, 7} {
			t.Run(fmt.Sprint(shares), func(t *testing.T) {
				n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "A100-SXM4-40GB", false)),
					devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: shares}))
				total := int64(n.model.Devices[0].GPU.MemoryBytes)
				for i := range shares {
					res := n.allocate(n.claim(gpuTemplate("shares: 1")))
					if res == nil {
						t.Fatalf("share %d of %d found no room", i+1, shares)
					}
					limits := checkShare(t, n, res, "gpu-0", map[string]string{"shares": "1", "memory": "0"})
					want := devicemodel.ShareLimits{PinnedMemoryBytes: total / int64(shares), ActiveThreadPercentage: 100 / shares}
					if shares == 1 {
						want = devicemodel.ShareLimits{} // the one share is the whole GPU
					}
					if limits != want {
						t.Errorf("limits %+v, want %+v", limits, want)
					}
				}
				if res := n.allocate(n.claim(gpuTemplate("shares: 1"))); res != nil {
					t.Errorf("share %d of %d allocated: %+v", shares+1, shares, res.Devices.Results)
				}
			})
		}
		t.Run("several shares per claim", func(t *testing.T) {
			n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "L40S", false)),
				devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4}))
			runSteps(t, n, []step{
				{template: gpuTemplate("shares: 2"), device: "gpu-0", consumed: map[string]string{"shares": "2", "memory": "0"}},
				{template: gpuTemplate("shares: 3")},
				{template: gpuTemplate("shares: 1"), device: "gpu-0", consumed: map[string]string{"shares": "1", "memory": "0"}},
				{template: gpuTemplate("memory: 4Gi")}, // memory is for nodes that share by memory
				{template: gpuTemplate("shares: 5")},
				{template: gpuTemplate("shares: 1"), device: "gpu-0", consumed: map[string]string{"shares": "1", "memory": "0"}},
				{template: gpuTemplate("shares: 1")},
				{release: 1},
				{template: gpuTemplate("shares: 2"), device: "gpu-0", consumed: map[string]string{"shares": "2", "memory": "0"}},
			})
		})
	})
}

func TestUnlimitedSharing(t *testing.T) {
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "H200-SXM5-141GB", false)), devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingUnlimited}))
		for i := range 50 {
			res := n.allocate(n.claim(gpuTemplate("memory: 0")))
			if res == nil {
				t.Fatalf("claim %d found no room", i+1)
			}
			if limits := checkShare(t, n, res, "gpu-0", map[string]string{"memory": "0"}); limits != (devicemodel.ShareLimits{}) {
				t.Errorf("limits %+v, want none", limits)
			}
		}
		runSteps(t, n, []step{
			{template: gpuTemplate("memory: 100Gi"), device: "gpu-0", consumed: map[string]string{"memory": "100Gi"}},
			{template: gpuTemplate("memory: 100Gi")},
			{template: gpuTemplate("memory: 0"), device: "gpu-0", consumed: map[string]string{"memory": "0"}},
		})
	})
}

// TestAClaimThatAsksForNothingGetsTheWholeGPU: in every sharing mode, a
// claim written for "a GPU" consumes all of it and has no caps, so it
// never gets less than on an unshared node; with ShareByDefault it gets
// what NVIDIA's driver gives (one share, or nothing in unlimited).
func TestAClaimThatAsksForNothingGetsTheWholeGPU(t *testing.T) {
	const h100 = "81559Mi"
	tests := []struct {
		sharing       devicemodel.Sharing
		whole, second map[string]string // consumed by a plain claim; by a share asked for explicitly
		secondAsks    string
		shareLimits   devicemodel.ShareLimits // of a plain claim with ShareByDefault
	}{
		{
			sharing: devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute},
			whole:   map[string]string{"memory": h100, "compute": "0"}, secondAsks: "memory: 1Gi",
			shareLimits: devicemodel.ShareLimits{},
		},
		{
			sharing: devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4},
			whole:   map[string]string{"shares": "4", "memory": "0"}, secondAsks: "shares: 1",
			shareLimits: devicemodel.ShareLimits{PinnedMemoryBytes: 81559 << 20 / 4, ActiveThreadPercentage: 25},
		},
		{
			sharing: devicemodel.Sharing{Mode: devicemodel.SharingUnlimited},
			whole:   map[string]string{"memory": h100}, secondAsks: "memory: 1Gi",
			shareLimits: devicemodel.ShareLimits{},
		},
	}
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		for _, tc := range tests {
			t.Run(tc.sharing.String(), func(t *testing.T) {
				n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", false)), devicemodel.WithSharing(tc.sharing))
				res := n.allocate(n.claim(gpuTemplate()))
				if res == nil {
					t.Fatal("a plain claim found no room on an idle shared GPU")
				}
				if limits := checkShare(t, n, res, "gpu-0", tc.whole); limits != (devicemodel.ShareLimits{}) {
					t.Errorf("a plain claim has caps %+v, want none: it holds the whole GPU", limits)
				}
				if res := n.allocate(n.claim(gpuTemplate(tc.secondAsks))); res != nil {
					t.Errorf("a share (%s) was allocated beside a claim holding the whole GPU: %+v", tc.secondAsks, res.Devices.Results)
				}

				tc.sharing.ShareByDefault = true
				n = newShareNode(t, features, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", false)), devicemodel.WithSharing(tc.sharing))
				res = n.allocate(n.claim(gpuTemplate()))
				if res == nil {
					t.Fatal("a plain claim found no room on an idle shared GPU")
				}
				d, _ := n.model.Lookup("gpu-0")
				limits, err := d.ShareLimits(res.Devices.Results[0].ConsumedCapacity)
				if err != nil || limits != tc.shareLimits {
					t.Errorf("share by default: a plain claim consumed %v, caps %+v (%v); want %+v", res.Devices.Results[0].ConsumedCapacity, limits, err, tc.shareLimits)
				}
				if tc.sharing.Mode != devicemodel.SharingMemoryCompute && n.allocate(n.claim(gpuTemplate())) == nil {
					t.Error("share by default: a second plain claim found no room")
				}
			})
		}
	})
}

// TestSharesExcludeMIGAndVFIO: on a GPU offered both whole and as MIG
// placements (mode switching) and for passthrough, a share, a MIG device
// and the VFIO device never coexist, and further shares do not charge the
// GPU's counters again. A GPU that stays in MIG mode is never shared.
func TestSharesExcludeMIGAndVFIO(t *testing.T) {
	switching := []devicemodel.Option{devicemodel.WithDynamicMIG(), switchAll, vfioFor(devicemodel.VFIOBeside)}
	one := map[string]string{"shares": "1", "memory": "0"}
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		t.Run("mode switching, VFIO beside", func(t *testing.T) {
			for _, migEnabled := range []bool{false, true} {
				n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", migEnabled)),
					append(slices.Clone(switching), devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4}))...)
				runSteps(t, n, []step{
					{template: gpuTemplate("shares: 1"), device: "gpu-0", consumed: one}, // 1
					{template: migTemplate("1g.10gb")},
					{template: vfioTemplate},
					{template: gpuTemplate("shares: 1"), device: "gpu-0", consumed: one}, // 4
					{template: gpuTemplate("shares: 1"), device: "gpu-0", consumed: one}, // 5
					{template: migTemplate("7g.80gb")},
					{release: 1}, {release: 4},
					{template: migTemplate("1g.10gb")}, // one share is still there
					{release: 5},
					{template: migTemplate("1g.10gb"), device: "gpu-0-mig-1g10gb-19-6"}, // 11
					{template: gpuTemplate("shares: 1")},
					{template: vfioTemplate},
					{release: 11},
					{template: vfioTemplate, device: "gpu-vfio-0"}, // 15
					{template: gpuTemplate("shares: 1")},
					{release: 15},
					{template: gpuTemplate("shares: 4"), device: "gpu-0", consumed: map[string]string{"shares": "4", "memory": "0"}},
				})
			}
		})
		t.Run("memory-compute beside MIG", func(t *testing.T) {
			n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", true)),
				append(slices.Clone(switching), devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}))...)
			runSteps(t, n, []step{
				{template: migTemplate("3g.40gb"), device: "gpu-0-mig-3g40gb-9-4"},
				{template: gpuTemplate("memory: 1Gi")},
				{release: 1},
				{template: gpuTemplate("memory: 1Gi"), device: "gpu-0", consumed: map[string]string{"memory": "1Gi", "compute": "0"}},
				{template: migTemplate("1g.10gb")},
			})
		})
		t.Run("MIG mode stays on", func(t *testing.T) {
			n := newShareNode(t, features, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", true), simGPU(t, 1, "L40S", false)),
				devicemodel.WithDynamicMIG(), devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 2}))
			runSteps(t, n, []step{
				{template: gpuTemplate("shares: 1"), device: "gpu-1", consumed: one},
				{template: gpuTemplate("shares: 1"), device: "gpu-1", consumed: one},
				{template: gpuTemplate("shares: 1")}, // gpu-0 is in MIG mode: never shared
				{template: migTemplate("7g.80gb"), device: "gpu-0-mig-7g80gb-0-0"},
			})
		})
	})
}
