package draplugin_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// migFleet has two H100s in MIG mode with no MIG device yet and one H100
// with MIG mode off.
const migFleet = `
nodes:
- name: mig-0
  gpus:
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB}
`

func newMIGHarness(t *testing.T, mutate ...func(*draplugin.Config)) *harness {
	t.Helper()
	return newHarnessIn(t, shorttemp.Dir(t), append([]func(*draplugin.Config){withFleet(t, migFleet, "mig-0")}, mutate...)...)
}

// inventory discovers the simulated node's hardware as it is now.
func (h *harness) inventory() *hardware.Inventory {
	h.tb.Helper()
	inv, err := h.cfg.Hardware.Discover(context.Background())
	if err != nil {
		h.tb.Fatal(err)
	}
	return inv
}

// migDevices lists the MIG devices that exist on GPU index i.
func (h *harness) migDevices(i int) []hardware.MIGDevice {
	return h.inventory().GPUs[i].MIGDevices
}

// migName is the device name of a dynamic MIG device on GPU index i.
func (h *harness) migName(i int, profile string, start int) string {
	h.tb.Helper()
	gpu := h.inventory().GPUs[i]
	for _, p := range gpu.MIGProfiles {
		if p.Name == profile {
			return devicemodel.MIGName(gpu.Minor, p.Name, p.ProfileID, start)
		}
	}
	h.tb.Fatalf("GPU %d has no profile %s", i, profile)
	return ""
}

func (h *harness) published(name string) bool {
	return slices.ContainsFunc(h.driver.Devices(), func(d resourceapi.Device) bool { return d.Name == name })
}

func TestDynamicMIGPublishesPlacementsWithCounters(t *testing.T) {
	h := newMIGHarness(t)
	for _, name := range []string{h.migName(0, "1g.10gb", 6), h.migName(1, "7g.80gb", 0), h.migName(0, "3g.40gb", 4)} {
		if !h.published(name) {
			t.Errorf("dynamic MIG device %s not published", name)
		}
	}
	gpu2 := devicemodel.GPUName(h.inventory().GPUs[2].Minor)
	gpu0 := devicemodel.GPUName(h.inventory().GPUs[0].Minor)
	if !h.published(gpu2) || h.published(gpu0) {
		t.Errorf("full GPUs: want %s (MIG off) published and %s (MIG on) not", gpu2, gpu0)
	}
	// The slices are published in the background; wait for all of them.
	var counterSets, consumers int
	waitFor(t, func() bool {
		slices, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		counterSets, consumers = 0, 0
		for _, s := range slices.Items {
			if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
				t.Errorf("slice %s has both devices and shared counters", s.Name)
			}
			counterSets += len(s.Spec.SharedCounters)
			for _, d := range s.Spec.Devices {
				if len(d.ConsumesCounters) > 0 {
					consumers++
				}
			}
		}
		// One counter set per MIG-capable GPU; 25 placements on each of
		// two H100s in MIG mode and the third's full GPU consume them.
		return counterSets == 3 && consumers == 51
	})
}

func TestDynamicMIGPrepareCreatesAndUnprepareDestroys(t *testing.T) {
	h := newMIGHarness(t)
	name := h.migName(0, "3g.40gb", 4)
	claim := h.claim(name)
	resp := h.mustPrepare(claim)

	migs := h.migDevices(0)
	if len(migs) != 1 || migs[0].Profile != "3g.40gb" || migs[0].PlacementStart != 4 {
		t.Fatalf("MIG devices after prepare = %+v, want one 3g.40gb at 4", migs)
	}
	spec := ociEdits(t, h.cfg.CDIDir, resp.Devices[0].CdiDeviceIds)
	var caps []string
	for _, n := range deviceNodes(spec) {
		if strings.HasPrefix(n.path, "/dev/nvidia-caps/") {
			caps = append(caps, n.path)
		}
	}
	if len(caps) != 2 || !slices.Contains(caps, capPath(migs[0].GICapMinor)) || !slices.Contains(caps, capPath(migs[0].CICapMinor)) {
		t.Errorf("MIG access nodes %v, want those of GI %d and CI %d", caps, migs[0].GICapMinor, migs[0].CICapMinor)
	}
	cp := h.checkpoint()
	if !strings.Contains(cp, `"dynamicMIG":{"devices":[{"device":"`) || !strings.Contains(cp, `"profile":"3g.40gb"`) || !strings.Contains(cp, migs[0].UUID) || !strings.HasPrefix(cp, `{"version":"v5"`) || !strings.Contains(cp, `"requires":["dynamicMIG"]`) {
		t.Errorf("checkpoint does not record the created instance %s:\n%s", migs[0].UUID, cp)
	}

	// The info metric names the created MIG device, its parent and its
	// GPU instance, as DCGM exporter labels the device's series.
	rec := httptest.NewRecorder()
	h.driver.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	parent := h.inventory().GPUs[0].UUID
	want := fmt.Sprintf(`gpudra_prepared_device_info{GPU_I_ID="%d",UUID="%s",claim="%s",device="%s",mig_uuid="%s",namespace="default",pod="pod-of-%s",pod_group="",request="gpu0"} 1`,
		migs[0].GIID, parent, claim.Name, name, migs[0].UUID, claim.Name)
	if !strings.Contains(rec.Body.String(), want) {
		t.Errorf("metrics lack %s:\n%s", want, grep(rec.Body.String(), "prepared_device_info"))
	}

	// Prepare is idempotent: no second instance.
	h.mustPrepare(claim)
	if n := len(h.migDevices(0)); n != 1 {
		t.Errorf("second prepare left %d MIG devices, want 1", n)
	}

	h.mustUnprepare(claim)
	if migs := h.migDevices(0); len(migs) != 0 {
		t.Errorf("MIG devices after unprepare = %+v, want none", migs)
	}
	if files := h.specFiles(); len(files) != 0 {
		t.Errorf("CDI specs after unprepare: %v", files)
	}
	if strings.Contains(h.checkpoint(), string(claim.UID)) {
		t.Errorf("checkpoint still names the claim:\n%s", h.checkpoint())
	}
	// The placement is free again.
	again := h.claim(h.migName(0, "2g.20gb", 4))
	h.mustPrepare(again)
}

func capPath(minor int) string { return "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(minor) }

func TestDynamicMIGOverlappingClaimsRefused(t *testing.T) {
	h := newMIGHarness(t)
	first := h.claim(h.migName(0, "4g.40gb", 0))
	h.mustPrepare(first)
	// The scheduler would never allocate this (shared counters); the driver
	// is the last guard all the same.
	second := h.claim(h.migName(0, "1g.10gb", 2))
	r := h.prepare(second).Claims[string(second.UID)]
	if r.Error == "" || !strings.Contains(r.Error, "already prepared for claim") {
		t.Errorf("overlapping placement prepared: %+v", r)
	}
	if migs := h.migDevices(0); len(migs) != 1 {
		t.Errorf("MIG devices = %+v, want only the first claim's", migs)
	}
	// A full GPU and a MIG device of it are one device too.
	full := h.claim(h.migName(1, "7g.80gb", 0), h.migName(1, "1g.10gb", 0))
	if r := h.prepare(full).Claims[string(full.UID)]; r.Error == "" {
		t.Errorf("claim with two overlapping placements prepared")
	}
	if migs := h.migDevices(1); len(migs) != 0 {
		t.Errorf("refused claim left MIG devices %+v", migs)
	}
}

// failingMIG fails CreateMIGDevice on the n-th call.
type failingMIG struct {
	hardware.MIGManager
	failOn int64
	calls  atomic.Int64
}

func (f *failingMIG) CreateMIGDevice(ctx context.Context, p hardware.MIGPlacement) (hardware.MIGDevice, error) {
	if f.calls.Add(1) == f.failOn {
		return hardware.MIGDevice{}, errors.New("injected: NVML_ERROR_UNKNOWN")
	}
	return f.MIGManager.CreateMIGDevice(ctx, p)
}

func TestDynamicMIGRollbackOnFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failOn int64
		step   draplugin.Step
	}{
		{"second MIG device", 2, ""},
		{"CDI spec", 0, draplugin.StepWriteCDISpec},
		{"completion record", 0, draplugin.StepRecordCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fail atomic.Bool
			fail.Store(true)
			h := newMIGHarness(t, func(cfg *draplugin.Config) {
				cfg.MIG = &failingMIG{MIGManager: cfg.Hardware.(hardware.MIGManager), failOn: tc.failOn}
				cfg.Faults = func(step draplugin.Step, _ string) error {
					if step == tc.step && fail.Load() {
						return errors.New("injected")
					}
					return nil
				}
			})
			claim := h.claim(h.migName(0, "2g.20gb", 0), h.migName(0, "2g.20gb", 2))
			r := h.prepare(claim).Claims[string(claim.UID)]
			if r.Error == "" {
				t.Fatal("prepare succeeded despite the injected failure")
			}
			if migs := h.migDevices(0); len(migs) != 0 {
				t.Errorf("MIG devices after the failed prepare = %+v, want none", migs)
			}
			if files := h.specFiles(); len(files) != 0 {
				t.Errorf("CDI specs after the failed prepare: %v", files)
			}
			if strings.Contains(h.checkpoint(), string(claim.UID)) {
				t.Errorf("checkpoint keeps the failed claim:\n%s", h.checkpoint())
			}
			fail.Store(false)
			h.mustPrepare(claim) // the kubelet retries (failOn is past)
			if n := len(h.migDevices(0)); n != 2 {
				t.Errorf("retry created %d MIG devices, want 2", n)
			}
		})
	}
}

// operatorInstance creates a MIG device behind gpudra's back.
func (h *harness) operatorInstance(gpu int, profile string, start int) hardware.MIGDevice {
	h.tb.Helper()
	inv := h.inventory()
	var id int
	for _, p := range inv.GPUs[gpu].MIGProfiles {
		if p.Name == profile {
			id = p.ProfileID
		}
	}
	m, err := h.cfg.Hardware.(hardware.MIGManager).CreateMIGDevice(context.Background(), hardware.MIGPlacement{ParentUUID: inv.GPUs[gpu].UUID, ProfileID: id, Start: start})
	if err != nil {
		h.tb.Fatal(err)
	}
	return m
}

func TestMIGOwnershipRebuiltAfterCheckpointLoss(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(path string) error
		dropCDI bool
	}{
		{"deleted", os.Remove, false},
		{"corrupt", func(p string) error { return os.WriteFile(p, []byte(`{"version":"v5","claims":{`), 0o644) }, false},
		{"deleted with the CDI specs", os.Remove, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMIGHarness(t)
			ours := h.claim(h.migName(0, "3g.40gb", 0))
			h.mustPrepare(ours)
			mine := h.migDevices(0)[0]
			foreign := h.operatorInstance(1, "1g.10gb", 3)

			h.stop()
			if err := tc.damage(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
				t.Fatal(err)
			}
			if tc.dropCDI {
				if err := os.RemoveAll(h.cfg.CDIDir); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(h.cfg.CDIDir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			h.start()

			// Both instances survive the restart.
			if migs := h.migDevices(0); len(migs) != 1 || migs[0].UUID != mine.UUID {
				t.Errorf("GPU 0 MIG devices after restart = %+v, want our %s", migs, mine.UUID)
			}
			if migs := h.migDevices(1); len(migs) != 1 || migs[0].UUID != foreign.UUID {
				t.Errorf("GPU 1 MIG devices after restart = %+v, want the operator's %s", migs, foreign.UUID)
			}
			// GPU 0 is ours again; GPU 1 offers its unknown instance as a
			// static MIG device and only the placements that miss it,
			// with an event.
			if !h.published(h.migName(0, "1g.10gb", 5)) {
				t.Errorf("GPU 0 not offered after its instance was adopted")
			}
			if d := h.device(h.migName(1, "1g.10gb", 3)); d.Attributes["uuid"].StringValue == nil || *d.Attributes["uuid"].StringValue != foreign.UUID {
				t.Errorf("GPU 1's instance of unknown ownership is not published as the static MIG device it is: %+v", d.Attributes)
			}
			if h.published(h.migName(1, "7g.80gb", 0)) || !h.published(h.migName(1, "1g.10gb", 0)) {
				t.Errorf("GPU 1 offers 7g.80gb@0 (%v), overlapping the unknown instance, or not 1g.10gb@0 (%v), missing it",
					h.published(h.migName(1, "7g.80gb", 0)), h.published(h.migName(1, "1g.10gb", 0)))
			}
			msg, err := h.waitForEvent("MIGOwnershipUnknown")
			if err != nil || !strings.Contains(msg, foreign.UUID) {
				t.Errorf("MIGOwnershipUnknown event = %q, %v; want one naming %s", msg, err, foreign.UUID)
			}

			// Unprepare destroys ours and only ours.
			h.mustUnprepare(ours)
			if migs := h.migDevices(0); len(migs) != 0 {
				t.Errorf("our instance survived unprepare: %+v", migs)
			}
			if migs := h.migDevices(1); len(migs) != 1 {
				t.Errorf("operator's instance destroyed: %+v", migs)
			}
			// A sweep never destroys the unknown one either.
			h.driver.Sweep(context.Background())
			if migs := h.migDevices(1); len(migs) != 1 {
				t.Errorf("sweep destroyed the operator's instance")
			}
		})
	}
}

func TestStaticMIGModeNeverCreates(t *testing.T) {
	h := newMIGHarness(t, func(cfg *draplugin.Config) { cfg.MIGMode = draplugin.MIGModeStatic })
	h.operatorInstance(0, "2g.20gb", 2)
	h.driver.Sweep(context.Background())
	h.restart()
	for _, d := range h.driver.Devices() {
		if strings.Contains(d.Name, "-mig-") && d.Name != h.migName(0, "2g.20gb", 2) {
			t.Errorf("static mode publishes %s, which does not exist", d.Name)
		}
		if len(d.ConsumesCounters) > 0 {
			t.Errorf("static mode publishes %s with counters", d.Name)
		}
	}
	claim := h.claim(h.migName(0, "2g.20gb", 2))
	h.mustPrepare(claim)
	h.mustUnprepare(claim)
	if n := len(h.migDevices(0)); n != 1 {
		t.Errorf("static mode destroyed the operator's MIG device (%d left)", n)
	}
}

// dropCounters makes the fake API server behave like one without
// partitionable devices: it stores ResourceSlices without shared counters
// and counter consumption, and answers with what it stored.
func dropCounters(client *fake.Clientset) {
	var n atomic.Int64
	strip := func(obj runtime.Object) *resourceapi.ResourceSlice {
		s := obj.(*resourceapi.ResourceSlice).DeepCopy()
		s.Spec.SharedCounters = nil
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].ConsumesCounters = nil
		}
		if s.Name == "" {
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n.Add(1))
		}
		return s
	}
	client.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a := action.(k8stesting.CreateAction)
		s := strip(a.GetObject())
		if isDryRun(action) {
			return true, s, nil
		}
		return true, s, client.Tracker().Create(a.GetResource(), s, "")
	})
	client.PrependReactor("update", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a := action.(k8stesting.UpdateAction)
		s := strip(a.GetObject())
		return true, s, client.Tracker().Update(a.GetResource(), s, "")
	})
}

func TestDynamicMIGFallsBackWithoutPartitionableDevices(t *testing.T) {
	client := newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mig-0", UID: "node-uid"}})
	dropCounters(client)
	h := newMIGHarness(t, func(cfg *draplugin.Config) { cfg.KubeClient = client })
	if _, err := h.waitForEvent("DynamicMIGUnavailable"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, d := range h.driver.Devices() {
			if d.ConsumesCounters != nil || strings.Contains(d.Name, "-mig-") {
				return false
			}
		}
		return true
	})
	// Nothing with counters is left in the API server either.
	waitFor(t, func() bool {
		slices, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, s := range slices.Items {
			for _, d := range s.Spec.Devices {
				if strings.Contains(d.Name, "-mig-") {
					return false
				}
			}
		}
		return len(slices.Items) > 0
	})
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDynamicMIGCrashBeforeCompletion: a plugin that died after recording
// the start of a preparation and creating its MIG device leaves an
// instance its start record owns. The next plugin keeps the GPU offered,
// and the retry (or, once the kubelet gave up, the sweep) destroys that
// instance before anything else.
func TestDynamicMIGCrashBeforeCompletion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		age   time.Duration
		retry bool
	}{
		{"retried", 0, true},
		{"swept", time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMIGHarness(t)
			name := h.migName(0, "2g.20gb", 4)
			leftover := h.operatorInstance(0, "2g.20gb", 4) // what the dead plugin created
			parent := h.inventory().GPUs[0].UUID
			h.stop()
			uid := "00000000-0000-0000-0000-000000000001" // the harness's first claim
			record := fmt.Sprintf(`{"version":"v5","bootID":"boot-1","requires":["dynamicMIG"],"claims":{%q:{"uid":%q,"namespace":"default","name":"claim-1",`+
				`"phase":"PrepareStarted","startedAt":%q,"devices":[{"requests":["gpu0"],"pool":"mig-0","name":%q,"parentUUID":%q}],`+
				`"records":{"dynamicMIG":{"devices":[{"device":%q,"parentUUID":%q,"profile":"2g.20gb","profileID":14,"start":4,"size":2}]}}}}}`,
				uid, uid, time.Now().Add(-tc.age).UTC().Format(time.RFC3339Nano), name, parent, name, parent)
			if err := os.WriteFile(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"), []byte(record), 0o600); err != nil {
				t.Fatal(err)
			}
			h.start()
			if h.driver.Devices() == nil || !h.published(h.migName(0, "1g.10gb", 0)) {
				t.Fatal("GPU 0 left out although the start record owns its instance")
			}
			if tc.retry {
				claim := h.claim(name)
				h.mustPrepare(claim)
				migs := h.migDevices(0)
				if len(migs) != 1 || migs[0].UUID == leftover.UUID {
					t.Errorf("after the retry: MIG devices %+v, want one new instance (the leftover %s destroyed)", migs, leftover.UUID)
				}
				if !strings.Contains(h.checkpoint(), `"phase":"PrepareCompleted"`) {
					t.Errorf("retry did not complete:\n%s", h.checkpoint())
				}
				return
			}
			h.driver.Sweep(h.ctx)
			if migs := h.migDevices(0); len(migs) != 0 {
				t.Errorf("sweep left MIG devices %+v", migs)
			}
			if strings.Contains(h.checkpoint(), uid) {
				t.Errorf("sweep kept the record:\n%s", h.checkpoint())
			}
		})
	}
}

// A node migrated from NVIDIA's device plugin or static-MIG driver keeps
// its operator's MIG layout under the default dynamic mode: the existing
// MIG devices are published as static ones, used as they are and never
// destroyed; dynamic claims get the placements that miss them.
func TestMigratedMIGLayoutStaysUsable(t *testing.T) {
	h := newMIGHarness(t)
	small := h.operatorInstance(0, "1g.10gb", 0)
	big := h.operatorInstance(0, "3g.40gb", 4)
	h.restart() // as a plugin started on the migrated node
	layout := func(t *testing.T, want int) {
		t.Helper()
		migs := h.migDevices(0)
		if len(migs) != want || !slices.ContainsFunc(migs, func(m hardware.MIGDevice) bool { return m.UUID == small.UUID }) ||
			!slices.ContainsFunc(migs, func(m hardware.MIGDevice) bool { return m.UUID == big.UUID }) {
			t.Fatalf("GPU 0 MIG devices %+v, want %d with the operator's %s and %s", migs, want, small.UUID, big.UUID)
		}
	}
	existing := h.migName(0, "1g.10gb", 0)
	if d := h.device(existing); d.Attributes["uuid"].StringValue == nil || *d.Attributes["uuid"].StringValue != small.UUID || len(d.ConsumesCounters) != 0 {
		t.Fatalf("%s is not published as the static MIG device %s: %+v", existing, small.UUID, d)
	}
	for _, overlapping := range []string{h.migName(0, "7g.80gb", 0), h.migName(0, "4g.40gb", 0), h.migName(0, "1g.10gb", 5)} {
		if h.published(overlapping) {
			t.Errorf("placement %s, overlapping the operator's layout, is offered", overlapping)
		}
	}
	static := h.claim(existing)
	h.mustPrepare(static)
	layout(t, 2)
	dynamic := h.claim(h.migName(0, "1g.10gb", 2))
	h.mustPrepare(dynamic)
	layout(t, 3)
	h.mustUnprepare(static)
	h.mustUnprepare(dynamic)
	layout(t, 2)
}
