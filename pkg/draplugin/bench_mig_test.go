package draplugin_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// dgxH100MIGFleet is the built-in fleet dgx-h100 (8x H100 80GB) with MIG
// mode on every GPU and no MIG device yet: what a node in dynamic MIG mode
// publishes in full.
func dgxH100MIGFleet() string {
	var b strings.Builder
	b.WriteString("nodes:\n- name: " + nodeName + "\n  gpus:\n")
	for range 8 {
		b.WriteString("  - {model: H100-SXM5-80GB, migEnabled: true}\n")
	}
	return b.String()
}

// benchMIGNodes are the two shapes of an 8x H100 node in dynamic mode:
// MIG mode on (every profile at every placement) and off (full GPUs
// consuming their counter sets).
var benchMIGNodes = []struct{ name, fleet string }{
	{"migOn", dgxH100MIGFleet()},
	{"migOff", "dgx-h100"},
}

// benchSimNode loads a node of a built-in fleet or of fleet YAML.
func benchSimNode(b *testing.B, fleetNameOrYAML string) *simfleet.Node {
	b.Helper()
	fleet, err := simfleet.Load(fleetNameOrYAML)
	if err != nil {
		fleet, err = simfleet.Parse([]byte(fleetNameOrYAML), b.Name())
	}
	if err != nil {
		b.Fatal(err)
	}
	node, err := fleet.Node(nodeName)
	if err != nil {
		b.Fatal(err)
	}
	return node
}

// expectedPool is what the plugin should publish for a node: the device
// names and the counter set and slice counts of its model, built
// independently of the plugin from the same simulated hardware.
type expectedPool struct {
	devices     map[string]bool
	counterSets int
	slices      int
}

func expectPool(b *testing.B, node *simfleet.Node) expectedPool {
	b.Helper()
	inv, err := node.Hardware().Discover(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	model, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
	if err != nil {
		b.Fatal(err)
	}
	want := expectedPool{devices: map[string]bool{}, counterSets: len(model.CounterSets), slices: len(model.Slices())}
	for _, d := range model.Devices {
		want.devices[d.Name()] = true
	}
	if len(want.devices) == 0 || want.counterSets != len(inv.GPUs) || want.slices == 0 {
		b.Fatalf("model of %s: %d devices, %d counter sets, %d slices; want devices and one counter set per GPU",
			node.Name, len(want.devices), want.counterSets, want.slices)
	}
	return want
}

// complete reports whether slices are the whole pool: the expected number
// of slices, every one of the pool's current generation, holding every
// expected device once and every counter set.
func (want expectedPool) complete(pool map[string]*resourceapi.ResourceSlice) (bool, string) {
	if len(pool) != want.slices {
		return false, fmt.Sprintf("%d of %d slices", len(pool), want.slices)
	}
	seen := map[string]int{}
	sets := 0
	var generation int64 = -1
	for _, s := range pool {
		if int(s.Spec.Pool.ResourceSliceCount) != want.slices || (generation >= 0 && s.Spec.Pool.Generation != generation) {
			return false, fmt.Sprintf("slice %s: pool %+v", s.Name, s.Spec.Pool)
		}
		generation = s.Spec.Pool.Generation
		sets += len(s.Spec.SharedCounters)
		for _, d := range s.Spec.Devices {
			seen[d.Name]++
		}
	}
	if sets != want.counterSets {
		return false, fmt.Sprintf("%d of %d counter sets", sets, want.counterSets)
	}
	for name := range want.devices {
		if seen[name] != 1 {
			return false, fmt.Sprintf("device %s published %d times", name, seen[name])
		}
	}
	if len(seen) != len(want.devices) {
		return false, fmt.Sprintf("%d devices published, want %d", len(seen), len(want.devices))
	}
	return true, ""
}

// benchPluginConfig is the harness's plugin configuration (newHarnessIn)
// on directories under dir, for node, against client.
func benchPluginConfig(b *testing.B, dir string, node *simfleet.Node, client *fake.Clientset) draplugin.Config {
	b.Helper()
	for _, sub := range []string{"plugin", "registry", "cdi"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	bootID := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(bootID, []byte("boot-1\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	return draplugin.Config{
		DriverName:    driverName,
		NodeName:      node.Name,
		KubeClient:    client,
		Hardware:      node.Hardware(),
		MIGMode:       draplugin.MIGMode(node.MIGMode),
		PluginDataDir: filepath.Join(dir, "plugin"),
		RegistrarDir:  filepath.Join(dir, "registry"),
		CDIDir:        filepath.Join(dir, "cdi"),
		BootIDPath:    bootID,
	}
}

// waitForPool reads slice events until the pool is complete, and returns
// it with the time of the first event.
func waitForPool(b *testing.B, w watch.Interface, want expectedPool) (map[string]*resourceapi.ResourceSlice, time.Time) {
	b.Helper()
	pool := map[string]*resourceapi.ResourceSlice{}
	var first time.Time
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatal("ResourceSlice watch closed")
			}
			if first.IsZero() {
				first = time.Now()
			}
			s, isSlice := ev.Object.(*resourceapi.ResourceSlice)
			if !isSlice {
				b.Fatalf("watch event %s of %T", ev.Type, ev.Object)
			}
			if ev.Type == watch.Deleted {
				delete(pool, s.Name)
			} else {
				pool[s.Name] = s
			}
			if done, _ := want.complete(pool); done {
				return pool, first
			}
		case <-timeout:
			_, why := want.complete(pool)
			b.Fatalf("ResourceSlices not published within 30s: %s", why)
		}
	}
}

// encodedSizes encodes slices as client-go sends them: JSON, its default,
// and protobuf with the Kubernetes envelope.
func encodedSizes(b *testing.B, pool map[string]*resourceapi.ResourceSlice) (jsonBytes, protoBytes int) {
	b.Helper()
	jsonCodec := scheme.Codecs.LegacyCodec(resourceapi.SchemeGroupVersion)
	protoCodec := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), resourceapi.SchemeGroupVersion)
	for _, s := range pool {
		js, err := runtime.Encode(jsonCodec, s)
		if err != nil {
			b.Fatal(err)
		}
		pb, err := runtime.Encode(protoCodec, s)
		if err != nil {
			b.Fatal(err)
		}
		jsonBytes += len(js)
		protoBytes += len(pb)
	}
	return jsonBytes, protoBytes
}

// publicationMaxOps bounds the plugin starts of one BenchmarkMIGPublication
// run: each takes over a second (the resourceslice controller in
// k8s.io/dynamic-resource-allocation polls its informer's sync once a
// second before the first slice is written), so the -benchtime 300x of
// `make bench` would run past go test's ten-minute timeout.
const publicationMaxOps = 50

// fixedBenchOps returns N of -test.benchtime=Nx, if that is how it is set.
func fixedBenchOps() (int, bool) {
	f := flag.Lookup("test.benchtime")
	if f == nil {
		return 0, false
	}
	n, isCount := strings.CutSuffix(f.Value.String(), "x")
	if !isCount {
		return 0, false
	}
	ops, err := strconv.Atoi(n)
	return ops, err == nil
}

// BenchmarkMIGPublication: from draplugin.Start until every ResourceSlice of
// an 8x H100 node in dynamic mode is in the (fake) API server, observed
// through a watch, as the scheduler would see them. Each op is a fresh
// plugin process on fresh directories and a fresh API server: checkpoint
// creation, discovery through the simulated NVML, the device model,
// kubelet plugin registration sockets and the resourceslice controller's
// creates. "start-ns/op" is the part until draplugin.Start returns (the
// slices are published in the background after that), "first-slice-ns/op"
// until the first slice is in the API server. Setting up and stopping the
// plugin are outside the timer. See publicationMaxOps for -benchtime.
func BenchmarkMIGPublication(b *testing.B) {
	if ops, ok := fixedBenchOps(); ok && ops > publicationMaxOps {
		b.Skipf("each op starts a plugin and takes over a second; run it with -benchtime %dx or less (asked for %dx)", publicationMaxOps, ops)
	}
	for _, tc := range benchMIGNodes {
		b.Run(tc.name, func(b *testing.B) {
			node := benchSimNode(b, tc.fleet)
			want := expectPool(b, node)
			var started, firstSlice time.Duration
			var last map[string]*resourceapi.ResourceSlice
			for b.Loop() {
				b.StopTimer()
				dir, err := os.MkdirTemp("", "gpudra")
				if err != nil {
					b.Fatal(err)
				}
				client := newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: "node-uid"}})
				cfg := benchPluginConfig(b, dir, node, client)
				w, err := client.ResourceV1().ResourceSlices().Watch(context.Background(), metav1.ListOptions{})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.NewKlogr().V(10)))
				b.StartTimer()

				start := time.Now()
				driver, err := draplugin.Start(ctx, cfg)
				if err != nil {
					b.Fatalf("start plugin: %v", err)
				}
				started += time.Since(start)
				var first time.Time
				last, first = waitForPool(b, w, want)
				firstSlice += first.Sub(start)

				b.StopTimer()
				w.Stop()
				// What the watch saw is what the API server holds.
				list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
				if err != nil {
					b.Fatal(err)
				}
				stored := map[string]*resourceapi.ResourceSlice{}
				for i := range list.Items {
					stored[list.Items[i].Name] = &list.Items[i]
				}
				if ok, why := want.complete(stored); !ok {
					b.Fatalf("API server after publication: %s", why)
				}
				driver.Stop()
				cancel()
				if err := os.RemoveAll(dir); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			jsonBytes, protoBytes := encodedSizes(b, last)
			devices := 0
			for _, s := range last {
				devices += len(s.Spec.Devices)
			}
			b.ReportMetric(float64(started.Nanoseconds())/float64(b.N), "start-ns/op")
			b.ReportMetric(float64(firstSlice.Nanoseconds())/float64(b.N), "first-slice-ns/op")
			b.ReportMetric(float64(len(last)), "slices")
			b.ReportMetric(float64(devices), "devices")
			b.ReportMetric(float64(want.counterSets), "counter-sets")
			b.ReportMetric(float64(jsonBytes), "json-bytes")
			b.ReportMetric(float64(protoBytes), "proto-bytes")
		})
	}
}

// benchCDINodes resolves CDI device IDs as a container runtime does and
// returns the device node paths they add.
func benchCDINodes(b *testing.B, cdiDir string, ids []string) []string {
	b.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		b.Fatal(err)
	}
	spec := &ocispec.Spec{Process: &ocispec.Process{}, Linux: &ocispec.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		b.Fatalf("inject CDI devices %v: unresolved %v: %v", ids, unresolved, err)
	}
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	return paths
}

// statusStub answers the device status writer's applies to claim status
// itself, keeping what they carried, instead of the fake clientset's
// server-side apply, which builds a REST mapper on every call and costs
// more than all the rest of a MIG claim's Prepare: what is left is
// gpudra's own work.
type statusStub struct {
	mu      sync.Mutex
	patches []string
}

func (s *statusStub) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.patches)
}

func (s *statusStub) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.patches) == 0 {
		return ""
	}
	return s.patches[len(s.patches)-1]
}

// withStatusStub gives the plugin an API server whose claim status applies
// go to stub.
func withStatusStub(stub *statusStub) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		client := newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, UID: "node-uid"}})
		client.PrependReactor("patch", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
			pa, ok := action.(k8stesting.PatchAction)
			if !ok || pa.GetSubresource() != "status" || pa.GetPatchType() != types.ApplyPatchType {
				return false, nil, nil
			}
			stub.mu.Lock()
			stub.patches = append(stub.patches, string(pa.GetPatch()))
			stub.mu.Unlock()
			return true, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pa.GetNamespace(), Name: pa.GetName()}}, nil
		})
		cfg.KubeClient = client
	}
}

// BenchmarkPrepareOneMIGClaim: one NodePrepareResources call over gRPC
// with one claim for a dynamic MIG device (1g.10gb at the placement the
// scheduler tries first, on GPU 0), on an 8x H100 node in MIG mode with
// seven other 1g.10gb claims prepared, one on each other GPU: the shape of
// BenchmarkPrepareOneClaim. Prepare creates the GPU and compute instance
// in the simulated NVML, writes the checkpoint twice, the CDI spec and the
// claim's device status; Unprepare, timed apart as "unprepare-ns/op",
// destroys them and removes the status. "statusStubbed" is the same with
// the status applies answered by [statusStub] rather than the fake
// clientset; "full-gpu" is the same on the node with MIG mode off and
// full-GPU claims, which have no device status, for comparison.
func BenchmarkPrepareOneMIGClaim(b *testing.B) {
	migDevice := func(h *harness, gpu int) string { return h.migName(gpu, "1g.10gb", 6) }
	for _, tc := range []struct {
		name, fleet string
		device      func(h *harness, gpu int) string
		mig, stub   bool
	}{
		{"mig-1g.10gb", dgxH100MIGFleet(), migDevice, true, false},
		{"mig-1g.10gb-statusStubbed", dgxH100MIGFleet(), migDevice, true, true},
		{"full-gpu", "dgx-h100", func(h *harness, gpu int) string {
			return devicemodel.GPUName(h.inventory().GPUs[gpu].Minor)
		}, false, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			config := []func(*draplugin.Config){withFleet(b, tc.fleet, nodeName), withRunCDIDir(b)}
			var stub *statusStub
			if tc.stub {
				stub = &statusStub{}
				config = append(config, withStatusStub(stub))
			}
			h := newHarness(b, config...)
			for gpu := 1; gpu < 8; gpu++ {
				h.mustPrepare(h.claim(tc.device(h, gpu)))
			}
			name := tc.device(h, 0)
			claim := h.claim(name)
			wantMIG := 0
			if tc.mig {
				wantMIG = 1
			}
			var unprepare time.Duration
			first := true
			for b.Loop() {
				resp := h.prepare(claim)
				b.StopTimer()
				r := resp.Claims[string(claim.UID)]
				if r == nil || r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != name || len(r.Devices[0].CdiDeviceIds) != 1 {
					b.Fatalf("prepare %s: %+v", name, r)
				}
				migs := h.migDevices(0)
				if len(migs) != wantMIG {
					b.Fatalf("GPU 0 holds %d MIG devices after prepare, want %d", len(migs), wantMIG)
				}
				if first {
					checkPrepared(b, h, claim, r, migs, stub)
					first = false
				}
				applies := 0
				if stub != nil {
					applies = stub.count()
				}
				start := time.Now()
				h.mustUnprepare(claim)
				unprepare += time.Since(start)
				if n := len(h.migDevices(0)); n != 0 {
					b.Fatalf("GPU 0 holds %d MIG devices after unprepare, want none", n)
				}
				// The status removal runs after Unprepare returns.
				for deadline := time.Now().Add(10 * time.Second); stub != nil && stub.count() < applies+1 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				if stub != nil && (stub.count() != applies+1 || strings.Contains(stub.last(), `"devices"`)) {
					b.Fatalf("unprepare applied %d status patches, want 1 without devices: %s", stub.count()-applies, stub.last())
				}
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(float64(unprepare.Nanoseconds())/float64(b.N), "unprepare-ns/op")
		})
	}
}

// checkPrepared makes sure a prepared claim's CDI spec gives the container
// the device it was allocated: for a MIG device, the parent GPU's node and
// the access nodes of the GPU and compute instance that Prepare created,
// whose UUID the claim's status reports.
func checkPrepared(b *testing.B, h *harness, claim *resourceapi.ResourceClaim, r *drapb.NodePrepareResourceResponse, migs []hardware.MIGDevice, stub *statusStub) {
	b.Helper()
	paths := benchCDINodes(b, h.cfg.CDIDir, r.Devices[0].CdiDeviceIds)
	var caps []string
	for _, p := range paths {
		if strings.HasPrefix(p, "/dev/nvidia-caps/") {
			caps = append(caps, p)
		}
	}
	gpu := fmt.Sprintf("/dev/nvidia%d", h.inventory().GPUs[0].Minor)
	if !slices.Contains(paths, gpu) {
		b.Fatalf("CDI spec adds %v, not the GPU's node %s", paths, gpu)
	}
	if len(migs) == 0 {
		if len(caps) != 0 {
			b.Fatalf("full-GPU CDI spec adds MIG access nodes %v", caps)
		}
		return
	}
	m := migs[0]
	if m.Profile != "1g.10gb" || m.PlacementStart != 6 {
		b.Fatalf("created MIG device %s at %d, want 1g.10gb at 6", m.Profile, m.PlacementStart)
	}
	wantCaps := []string{capPath(m.GICapMinor), capPath(m.CICapMinor)}
	if len(caps) != 2 || !slices.Contains(caps, wantCaps[0]) || !slices.Contains(caps, wantCaps[1]) {
		b.Fatalf("CDI spec's MIG access nodes %v, want %v", caps, wantCaps)
	}
	if stub != nil {
		if !strings.Contains(stub.last(), m.UUID) {
			b.Fatalf("last claim status apply %s does not report MIG device %s", stub.last(), m.UUID)
		}
		return
	}
	got, err := h.client.ResourceV1().ResourceClaims(claim.Namespace).Get(context.Background(), claim.Name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].Data == nil || !strings.Contains(string(got.Status.Devices[0].Data.Raw), m.UUID) {
		b.Fatalf("claim status.devices %+v does not report MIG device %s", got.Status.Devices, m.UUID)
	}
}
