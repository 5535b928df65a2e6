package draplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

const timeSlicingConfig = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":%q}}}`

// deviceUUID returns the uuid attribute of a published device.
func (h *harness) deviceUUID(name string) string {
	h.tb.Helper()
	for _, d := range h.driver.Devices() {
		if d.Name == name {
			return *d.Attributes[devicemodel.AttrUUID].StringValue
		}
	}
	h.tb.Fatalf("no device %s", name)
	return ""
}

// shareClaim is an allocated claim for one uncapped share of device (the
// node shares GPUs without limit: withUnlimitedSharing), with an opaque
// claim config.
func (h *harness) shareClaim(device, shareID, params string) *resourceapi.ResourceClaim {
	h.tb.Helper()
	c := h.claim(device)
	c.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID(shareID))
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("0")}
	if params != "" {
		withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, params)
	}
	return h.update(c)
}

// withUnlimitedSharing publishes the node's GPUs for any number of claims.
func withUnlimitedSharing(t *testing.T) func(*draplugin.Config) {
	return func(c *draplugin.Config) {
		s, err := devicemodel.ParseSharing("unlimited")
		if err != nil {
			t.Fatal(err)
		}
		c.Sharing = s
	}
}

func prepareError(h *harness, c *resourceapi.ResourceClaim) string {
	h.tb.Helper()
	r := h.prepare(c).Claims[string(c.UID)]
	if r == nil {
		h.tb.Fatalf("no result for claim %s", c.Name)
	}
	return r.Error
}

func TestTimeSlicingOneIntervalPerGPU(t *testing.T) {
	setter := &timeslicing.Memory{}
	h := newHarness(t, withUnlimitedSharing(t), func(c *draplugin.Config) { c.TimeSlicer = setter })
	gpu := h.deviceUUID("gpu-7")
	interval := func() v1beta1.TimeSliceInterval {
		got, _ := setter.Interval(gpu)
		return got
	}

	long := h.shareClaim("gpu-7", "share-a", fmt.Sprintf(timeSlicingConfig, "Long"))
	h.mustPrepare(long)
	if got := interval(); got != v1beta1.LongTimeSlice {
		t.Fatalf("GPU time slice after the first claim = %q, want Long", got)
	}
	if cp := h.checkpoint(); !strings.HasPrefix(cp, `{"version":"v5"`) || !strings.Contains(cp, `"timeSlicing":{"gpus":[{"device":"gpu-7","gpu":"`+gpu+`","interval":"Long"}]}`) {
		t.Errorf("checkpoint does not record the hold as a v5 timeSlicing record: %s", cp)
	}

	short := h.shareClaim("gpu-7", "share-b", fmt.Sprintf(timeSlicingConfig, "Short"))
	msg := prepareError(h, short)
	for _, want := range []string{"sharing.timeSlicingConfig.interval", `"Short"`, `"Long"`, long.Name, `"Default", "Short", "Medium", "Long"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("conflicting interval: error %q does not mention %q", msg, want)
		}
	}
	if got := interval(); got != v1beta1.LongTimeSlice {
		t.Errorf("a refused claim changed the time slice to %q", got)
	}

	// A second holder of the same interval joins; the setting stays until
	// the last holder goes, even across a restart of the plugin.
	alsoLong := h.shareClaim("gpu-7", "share-c", fmt.Sprintf(timeSlicingConfig, "Long"))
	h.mustPrepare(alsoLong)
	h.mustUnprepare(long)
	if got := interval(); got != v1beta1.LongTimeSlice {
		t.Errorf("after one of two holders left: %q, want Long", got)
	}
	h.restart()
	if msg := prepareError(h, short); !strings.Contains(msg, "sharing.timeSlicingConfig.interval") {
		t.Errorf("after a restart the hold was forgotten: prepare = %q", msg)
	}
	h.mustUnprepare(alsoLong)
	if got := interval(); got != v1beta1.DefaultTimeSlice {
		t.Errorf("after the last holder left: %q, want Default", got)
	}
	if cp := h.checkpoint(); !strings.HasPrefix(cp, `{"version":"v2"`) {
		t.Errorf("checkpoint not v2 once no claim holds a record: %s", cp)
	}

	// Now the other interval is free to take.
	h.mustPrepare(short)
	if got := interval(); got != v1beta1.ShortTimeSlice {
		t.Errorf("after the conflict cleared: %q, want Short", got)
	}
	calls := setter.Calls()
	if len(calls) == 0 || calls[0].GPU != gpu {
		t.Errorf("setter calls %v, want them on %s", calls, gpu)
	}
}

func TestTimeSlicingSetFailureRollsBack(t *testing.T) {
	setter := &failingSetter{fail: map[v1beta1.TimeSliceInterval]bool{v1beta1.MediumTimeSlice: true}}
	h := newHarness(t, withUnlimitedSharing(t), func(c *draplugin.Config) { c.TimeSlicer = setter })
	c := h.shareClaim("gpu-2", "share-a", fmt.Sprintf(timeSlicingConfig, "Medium"))
	msg := prepareError(h, c)
	if !strings.Contains(msg, "set time slice Medium on GPU") || !strings.Contains(msg, "permission denied") {
		t.Errorf("error %q does not say what failed", msg)
	}
	if cp := h.checkpoint(); strings.Contains(cp, string(c.UID)) {
		t.Errorf("failed claim left a record: %s", cp)
	}
	if len(h.specFiles()) != 0 {
		t.Errorf("failed claim left CDI specs %v", h.specFiles())
	}
	if setter.last != v1beta1.DefaultTimeSlice {
		t.Errorf("last interval set %q, want the Default of the rollback", setter.last)
	}

	// When the rollback's reset fails too, the start record stays, so that
	// the reset is tried again; an Unprepare once nvidia-smi works again
	// finishes it.
	setter.fail[v1beta1.DefaultTimeSlice] = true
	if msg := prepareError(h, c); !strings.Contains(msg, "kept the start record") {
		t.Errorf("error %q does not say the record was kept", msg)
	}
	if cp := h.checkpoint(); !strings.Contains(cp, `"phase":"PrepareStarted"`) || !strings.Contains(cp, `"interval":"Medium"`) {
		t.Errorf("checkpoint lost the unfinished hold: %s", cp)
	}
	setter.fail = nil
	h.mustUnprepare(c)
	if cp := h.checkpoint(); strings.Contains(cp, string(c.UID)) || setter.last != v1beta1.DefaultTimeSlice {
		t.Errorf("after unprepare: last set %q, checkpoint %s; want Default and no record", setter.last, cp)
	}
}

// failingSetter fails to set the intervals in fail.
type failingSetter struct {
	mu   sync.Mutex
	fail map[v1beta1.TimeSliceInterval]bool
	last v1beta1.TimeSliceInterval
}

func (f *failingSetter) Set(_ context.Context, _ string, interval v1beta1.TimeSliceInterval) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail[interval] {
		return os.ErrPermission
	}
	f.last = interval
	return nil
}

// newMPSManager is an MPS manager over the fake control daemon, with its
// root under dir.
func newMPSManager(t *testing.T, root string) *mps.Manager {
	t.Helper()
	m, err := mps.New(root,
		mps.WithControlBinary(filepath.Join(fakeMPSBin, mpsfake.ControlName)),
		mps.WithTimeouts(10*time.Second, 2*time.Second, 10*time.Second),
		mps.WithPollInterval(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMPSClaimDaemonLifecycle(t *testing.T) {
	root := filepath.Join(shorttemp.Dir(t), "mps")
	h := newHarness(t, func(c *draplugin.Config) { c.MPS = newMPSManager(t, root) })
	gpu := h.deviceUUID("gpu-3")
	c := h.claim("gpu-3")
	withConfig(c, resourceapi.AllocationConfigSourceClaim, nil,
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi","multiUser":true}}}`)
	c = h.update(c)
	h.mustPrepare(c)

	dirs := h.cfg.MPS.Dirs(string(c.UID))
	rec, err := mpsfake.ReadRecord(dirs.Log)
	if err != nil {
		t.Fatalf("daemon record: %v", err)
	}
	if !rec.MultiUser || rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != 50 || rec.PinnedMemLimitMiB[gpu] != 10240 {
		t.Errorf("daemon got multiUser %v, threads %v, pinned %v; want true, 50, %s: 10240 MiB", rec.MultiUser, rec.ActiveThreadPercentage, rec.PinnedMemLimitMiB, gpu)
	}
	if len(rec.VisibleDevices) != 1 || rec.VisibleDevices[0] != gpu {
		t.Errorf("daemon serves %v, want [%s]", rec.VisibleDevices, gpu)
	}
	spec := h.specContent(c)
	for _, want := range []string{dirs.Pipe, mps.ContainerPipeDir, mps.EnvPipeDirectory + "=" + mps.ContainerPipeDir, dirs.Shm} {
		if !strings.Contains(spec, want) {
			t.Errorf("CDI spec lacks %q:\n%s", want, spec)
		}
	}

	// A restarted plugin takes the running daemon over.
	h.stop()
	h.cfg.MPS = newMPSManager(t, root)
	h.start()
	if again, err := mpsfake.ReadRecord(dirs.Log); err != nil || again.PID != rec.PID || !alive(rec.PID) {
		t.Errorf("after a restart the daemon is pid %d (alive %v), want the same pid %d", again.PID, alive(again.PID), rec.PID)
	}
	h.mustPrepare(c) // idempotent

	h.mustUnprepare(c)
	waitGone(t, rec.PID)
	if _, err := os.Stat(dirs.Root); !os.IsNotExist(err) {
		t.Errorf("daemon directory %s left behind: %v", dirs.Root, err)
	}
}

func TestMPSRefusals(t *testing.T) {
	root := filepath.Join(shorttemp.Dir(t), "mps")
	h := newHarness(t, func(c *draplugin.Config) { c.MPS = newMPSManager(t, root) })
	for _, tc := range []struct {
		name, params string
		want         []string
	}{
		{"index past the devices", `{"defaultPerDevicePinnedMemoryLimit":{"3":"1Gi"}}`, []string{"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[3]", "allowed: 0 to 0"}},
		{"unknown UUID", `{"defaultPerDevicePinnedMemoryLimit":{"GPU-nope":"1Gi"}}`, []string{"defaultPerDevicePinnedMemoryLimit[GPU-nope]", "not the UUID"}},
		{"no threads", `{"defaultActiveThreadPercentage":0}`, []string{"sharing.mpsConfig.defaultActiveThreadPercentage", "1 to 100"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.claim("gpu-1")
			withConfig(c, resourceapi.AllocationConfigSourceClaim, nil,
				`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":`+tc.params+`}}`)
			msg := prepareError(h, h.update(c))
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			if _, err := os.Stat(h.cfg.MPS.Dirs(string(c.UID)).Root); !os.IsNotExist(err) {
				t.Errorf("refused claim left an MPS daemon directory: %v", err)
			}
			if cp := h.checkpoint(); strings.Contains(cp, string(c.UID)) {
				t.Errorf("refused claim left a record: %s", cp)
			}
		})
	}

	// Without an MPS manager the strategy is refused with the reason.
	h2 := newHarness(t, func(c *draplugin.Config) { c.MPSUnavailable = "nvidia-cuda-mps-control not found under /driver-root" })
	c := h2.claim("gpu-1")
	withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`)
	if msg := prepareError(h2, h2.update(c)); !strings.Contains(msg, "sharing.strategy MPS") || !strings.Contains(msg, "not found under /driver-root") {
		t.Errorf("error %q does not name the strategy and the reason", msg)
	}
}

// specContent returns the claim's CDI spec file.
func (h *harness) specContent(c *resourceapi.ResourceClaim) string {
	h.tb.Helper()
	for _, f := range h.specFiles() {
		if strings.Contains(f, string(c.UID)) {
			data, err := os.ReadFile(filepath.Join(h.cfg.CDIDir, f))
			if err != nil {
				h.tb.Fatal(err)
			}
			return string(data)
		}
	}
	h.tb.Fatalf("no CDI spec for claim %s in %v", c.Name, h.specFiles())
	return ""
}

func alive(pid int) bool { return mpsfake.Alive(pid) }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("MPS daemon pid %d still alive", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMPSOneClaimPerPod(t *testing.T) {
	root := filepath.Join(shorttemp.Dir(t), "mps")
	h := newHarness(t, func(c *draplugin.Config) { c.MPS = newMPSManager(t, root) })
	const mpsConfig = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`
	first, second := h.claim("gpu-1"), h.claim("gpu-2")
	for _, c := range []*resourceapi.ResourceClaim{first, second} {
		withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, mpsConfig)
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-x", UID: "pod-uid-x"}}
	}
	first, second = h.update(first), h.update(second)
	h.mustPrepare(first)
	msg := prepareError(h, second)
	for _, want := range []string{"pod default/pod-x already uses MPS claim default/" + first.Name, "one claim"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if _, err := os.Stat(h.cfg.MPS.Dirs(string(second.UID)).Root); !os.IsNotExist(err) {
		t.Errorf("refused claim started a daemon: %v", err)
	}
	h.mustUnprepare(first)
	h.mustPrepare(second)
	h.mustUnprepare(second)
}

func TestFractionalSharesGetCappedDaemons(t *testing.T) {
	root := filepath.Join(shorttemp.Dir(t), "mps")
	shares4, err := devicemodel.ParseSharing("shares=4")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *draplugin.Config) {
		c.MPS = newMPSManager(t, root)
		c.Sharing = shares4
		c.TimeSlicer = &timeslicing.Memory{}
	})
	gpu := h.deviceUUID("gpu-2")
	if d := h.device("gpu-2"); d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Fatalf("gpu-2 is not shareable: %+v", d)
	}
	share := func(id string, shares int64) *resourceapi.ResourceClaim {
		c := h.claim("gpu-2")
		r := &c.Status.Allocation.Devices.Results[0]
		r.ShareID = ptr.To(types.UID(id))
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"shares": *resource.NewQuantity(shares, resource.DecimalSI), "memory": resource.MustParse("0")}
		return h.update(c)
	}
	one, two := share("share-1", 1), share("share-2", 2)
	h.mustPrepare(one)
	h.mustPrepare(two)
	for _, tc := range []struct {
		claim   *resourceapi.ResourceClaim
		threads float64
		mib     int64
	}{
		{one, 25, 81559 / 4},
		{two, 50, 81559 / 2},
	} {
		rec, err := mpsfake.ReadRecord(h.cfg.MPS.Dirs(string(tc.claim.UID)).Log)
		if err != nil {
			t.Fatalf("%s: no MPS daemon: %v", tc.claim.Name, err)
		}
		if rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != tc.threads || rec.PinnedMemLimitMiB[gpu] != tc.mib {
			t.Errorf("%s: daemon threads %v, pinned %v MiB; want %v and %d", tc.claim.Name, rec.ActiveThreadPercentage, rec.PinnedMemLimitMiB, tc.threads, tc.mib)
		}
		spec := h.specContent(tc.claim)
		if !strings.Contains(spec, "gpu-2-"+string(*tc.claim.Status.Allocation.Devices.Results[0].ShareID)) || !strings.Contains(spec, mps.ContainerPipeDir) {
			t.Errorf("%s: CDI spec lacks the share's device name or the MPS pipe directory:\n%s", tc.claim.Name, spec)
		}
	}

	// A config can lower a share's caps, not raise them; TimeSlicing cannot
	// enforce them and is refused.
	lowered := share("share-3", 1)
	withConfig(lowered, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":10,"defaultPinnedDeviceMemoryLimit":"80Gi"}}}`)
	lowered = h.update(lowered)
	h.mustPrepare(lowered)
	rec, _ := mpsfake.ReadRecord(h.cfg.MPS.Dirs(string(lowered.UID)).Log)
	if rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != 10 || rec.PinnedMemLimitMiB[gpu] != 81559/4 {
		t.Errorf("config over a share: threads %v, pinned %v; want 10 (lowered) and %d (not raised)", rec.ActiveThreadPercentage, rec.PinnedMemLimitMiB, 81559/4)
	}
	ts := share("share-4", 1)
	withConfig(ts, resourceapi.AllocationConfigSourceClaim, nil, fmt.Sprintf(timeSlicingConfig, "Long"))
	if msg := prepareError(h, h.update(ts)); !strings.Contains(msg, "sharing.strategy TimeSlicing") || !strings.Contains(msg, "allowed here: sharing.strategy MPS") {
		t.Errorf("TimeSlicing on a capped share: %q", msg)
	}

	for _, c := range []*resourceapi.ResourceClaim{one, two, lowered} {
		h.mustUnprepare(c)
		if _, err := os.Stat(h.cfg.MPS.Dirs(string(c.UID)).Root); !os.IsNotExist(err) {
			t.Errorf("%s: daemon directory left after unprepare: %v", c.Name, err)
		}
	}
}

func TestUncappedSharesOfOneGPU(t *testing.T) {
	unlimited, err := devicemodel.ParseSharing("unlimited")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(shorttemp.Dir(t), "mps")
	h := newHarness(t, func(c *draplugin.Config) { c.Sharing = unlimited; c.MPS = newMPSManager(t, root) })
	var claims []*resourceapi.ResourceClaim
	for _, id := range []string{"share-a", "share-b"} {
		c := h.claim("gpu-7")
		c.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID(id))
		c.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("0")}
		c = h.update(c)
		r := h.mustPrepare(c)
		if r.Devices[0].ShareId == nil || *r.Devices[0].ShareId != id {
			t.Errorf("share ID not returned: %v", r.Devices[0])
		}
		if _, err := os.Stat(h.cfg.MPS.Dirs(string(c.UID)).Root); !os.IsNotExist(err) {
			t.Errorf("an uncapped share got an MPS daemon: %v", err)
		}
		claims = append(claims, c)
	}
	for _, c := range claims {
		h.mustUnprepare(c)
	}
}

// TestMPSDaemonOfAdoptedClaim: after the checkpoint is lost, a claim
// adopted from its CDI spec owns its MPS daemon: a new plugin supervises
// it, and unpreparing the claim stops it.
func TestMPSDaemonOfAdoptedClaim(t *testing.T) {
	root := filepath.Join(shorttemp.Dir(t), "mps")
	h := newHarness(t, func(c *draplugin.Config) { c.MPS = newMPSManager(t, root) })
	c := h.claim("gpu-3")
	withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`)
	c = h.update(c)
	h.mustPrepare(c)
	dirs := h.cfg.MPS.Dirs(string(c.UID))
	rec, err := mpsfake.ReadRecord(dirs.Log)
	if err != nil {
		t.Fatal(err)
	}

	h.stop()
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	h.cfg.MPS = newMPSManager(t, root)
	h.start()
	if cp := h.checkpoint(); !strings.Contains(cp, `"adopted":true`) || !strings.Contains(cp, `"mps":{"daemons":[{"id":"`+string(c.UID)+`"`) {
		t.Fatalf("adopted record does not own the MPS daemon: %s", cp)
	}
	if !alive(rec.PID) {
		t.Fatalf("the daemon died across the restart")
	}
	h.mustUnprepare(c)
	waitGone(t, rec.PID)
	if _, err := os.Stat(dirs.Root); !os.IsNotExist(err) {
		t.Errorf("daemon directory left after unpreparing the adopted claim: %v", err)
	}
}
