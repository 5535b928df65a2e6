package preparer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

const (
	driverName = "gpu.nvidia.com"
	nodeName   = "node-0"
)

// hardwareFile models hardware state that outlives the process driving
// it: each configurator's setup is a line "<configurator> <claim UID>" in
// a file, as a MIG instance or a VFIO bind stays when the plugin dies.
type hardwareFile string

func (h hardwareFile) read(t testing.TB) []string {
	data, err := os.ReadFile(string(h))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

func (h hardwareFile) set(entry string, present bool) error {
	data, err := os.ReadFile(string(h))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	lines := map[string]bool{}
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" {
			lines[line] = true
		}
	}
	if present {
		lines[entry] = true
	} else {
		delete(lines, entry)
	}
	var b strings.Builder
	for _, l := range slices.Sorted(maps.Keys(lines)) {
		b.WriteString(l + "\n")
	}
	return os.WriteFile(string(h), []byte(b.String()), 0o644)
}

// fakeConfigurator sets up "its" hardware for every claim, recording the
// claim in its record first. fault, if set, is called at each of its steps
// (Plan, Apply, Undo), after Apply did its work: a failure there leaves the
// work done, as a real half-done apply would.
type fakeConfigurator struct {
	name  string
	hw    hardwareFile
	fault func(step string) error
}

type fakeRecord struct {
	Claim string `json:"claim"`
}

func (f *fakeConfigurator) Name() string { return f.name }

func (f *fakeConfigurator) step(s string) error {
	if f.fault == nil {
		return nil
	}
	return f.fault(f.name + "." + s)
}

func (f *fakeConfigurator) Plan(_ context.Context, c *preparer.Claim) (json.RawMessage, error) {
	if err := f.step("Plan"); err != nil {
		return nil, err
	}
	return json.Marshal(fakeRecord{Claim: c.UID})
}

func (f *fakeConfigurator) Apply(_ context.Context, c *preparer.Claim, rec json.RawMessage) (json.RawMessage, error) {
	if err := f.hw.set(f.name+" "+c.UID, true); err != nil {
		return nil, err
	}
	if err := f.step("Apply"); err != nil {
		return nil, err
	}
	for _, d := range c.Devices {
		d.AddEdits(&cdispec.ContainerEdits{Env: []string{strings.ToUpper(f.name) + "=on"}})
	}
	return rec, nil
}

func (f *fakeConfigurator) Undo(_ context.Context, uid string, rec json.RawMessage) error {
	var r fakeRecord
	if err := json.Unmarshal(rec, &r); err != nil || r.Claim != uid {
		return fmt.Errorf("record %s is not claim %s's", rec, uid)
	}
	if err := f.step("Undo"); err != nil {
		return err
	}
	return f.hw.set(f.name+" "+uid, false)
}

// fakeNode serves one GPU.
type fakeNode struct{}

func (fakeNode) Claim(_ context.Context, _ *resourceapi.ResourceClaim, intent claimstate.Intent) (*preparer.Claim, *cdispec.ContainerEdits, error) {
	inv := &hardware.Inventory{Majors: hardware.Majors{NVIDIA: 195, UVM: 510}}
	c := &preparer.Claim{UID: intent.UID, Namespace: intent.Namespace, Name: intent.Name, Consumers: intent.Consumers, Inventory: inv}
	for i := range intent.Devices {
		cd := intent.Devices[i]
		cd.UUID = "GPU-" + cd.Name
		model := &devicemodel.Device{Kind: devicemodel.KindGPU, API: resourceapi.Device{Name: cd.Name}, GPU: hardware.GPU{UUID: cd.UUID, Minor: 0}}
		c.Devices = append(c.Devices, &preparer.Device{State: &cd, Model: model})
	}
	return c, nil, nil
}

func (fakeNode) Allocated(context.Context) ([]preparer.AllocatedClaim, error) { return nil, nil }

func (fakeNode) Inventory() *hardware.Inventory { return nil }

func (fakeNode) Model() *devicemodel.Model { return nil }

// rig is a preparer over real files in dir, which may hold an earlier
// process's state.
type rig struct {
	t     testing.TB
	dir   string
	store *checkpoint.Store
	cdi   *cdi.Writer
	hw    hardwareFile
	prep  *preparer.Preparer
	confs []*fakeConfigurator
}

func newRig(t testing.TB, dir string, fault func(step string) error) *rig {
	t.Helper()
	bootID := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(bootID, []byte("boot-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dir: dir, hw: hardwareFile(filepath.Join(dir, "hardware"))}
	r.confs = []*fakeConfigurator{{name: "alpha", hw: r.hw, fault: fault}, {name: "beta", hw: r.hw, fault: fault}}
	confs := []preparer.Configurator{r.confs[0], r.confs[1]}
	store, _, err := checkpoint.Open(context.Background(), filepath.Join(dir, "plugin"),
		checkpoint.WithBootIDPath(bootID), checkpoint.WithKnownRecords(preparer.RecordNames(confs)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	r.store = store
	if r.cdi, err = cdi.NewWriter(filepath.Join(dir, "cdi"), driverName); err != nil {
		t.Fatal(err)
	}
	r.prep = preparer.New(preparer.Config{DriverName: driverName, NodeName: nodeName, Store: store, CDI: r.cdi, Node: fakeNode{}, Configurators: confs})
	return r
}

func testClaim() *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim", UID: "11111111-2222-3333-4444-555555555555"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: driverName, Pool: nodeName, Device: "gpu-0"},
			}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod", UID: "pod-uid"}},
		},
	}
}

func (r *rig) prepare() error {
	_, err := r.prep.Prepare(context.Background(), testClaim())
	return err
}

func (r *rig) unprepare() error {
	c := testClaim()
	_, err := r.prep.Unprepare(context.Background(), kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID})
	return err
}

// checkPrepared asserts the claim is fully prepared: both configurators'
// hardware, a completed record with both records, a spec with both edits.
func (r *rig) checkPrepared() {
	r.t.Helper()
	uid := string(testClaim().UID)
	if got, want := r.hw.read(r.t), []string{"alpha " + uid, "beta " + uid}; !slices.Equal(got, want) {
		r.t.Errorf("hardware = %v, want %v", got, want)
	}
	state, err := r.store.Read(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	c := state.Claims[uid]
	if c == nil || c.Phase != claimstate.PrepareCompleted || !slices.Equal(c.RecordNames(), []string{"alpha", "beta"}) {
		r.t.Errorf("record = %+v, want completed with alpha and beta records", c)
	}
	data, err := os.ReadFile(r.cdi.Path(uid))
	if err != nil {
		r.t.Fatalf("CDI spec: %v", err)
	}
	if !strings.Contains(string(data), "ALPHA=on") || !strings.Contains(string(data), "BETA=on") {
		r.t.Errorf("CDI spec lacks the configurators' edits:\n%s", data)
	}
}

// checkClean asserts nothing of the claim is left: no hardware, no record,
// no spec.
func (r *rig) checkClean() {
	r.t.Helper()
	if got := r.hw.read(r.t); len(got) != 0 {
		r.t.Errorf("hardware left behind: %v", got)
	}
	state, err := r.store.Read(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	if len(state.Claims) != 0 {
		r.t.Errorf("records left behind: %v", slices.Collect(maps.Keys(state.Claims)))
	}
	if uids, _ := r.cdi.ClaimUIDs(); len(uids) != 0 {
		r.t.Errorf("CDI specs left behind: %v", uids)
	}
}

// steps are every step of the two configurators and of the preparer.
var steps = []string{
	"alpha.Plan", "beta.Plan", "alpha.Apply", "beta.Apply",
	string(preparer.StepWriteCDISpec), string(preparer.StepRecordCompleted),
}

// TestFailureAtEachStep fails each step of a claim that uses two
// configurators once: Prepare reports it and leaves nothing behind (the
// configurator that failed half-way undoes too), and the kubelet's retry
// prepares the claim in full. Unprepare then leaves nothing; a failing
// Undo keeps the record until a retry succeeds.
func TestFailureAtEachStep(t *testing.T) {
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			armed := true
			fault := func(s string) error {
				if s == step && armed {
					armed = false
					return errors.New("injected")
				}
				return nil
			}
			r := newRig(t, t.TempDir(), fault)
			r.prep = preparerWithFaults(r, fault)
			if err := r.prepare(); err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("prepare = %v, want the injected failure", err)
			}
			r.checkClean()
			if err := r.prepare(); err != nil {
				t.Fatalf("retry: %v", err)
			}
			r.checkPrepared()
			if err := r.unprepare(); err != nil {
				t.Fatal(err)
			}
			r.checkClean()
		})
	}
	for _, step := range []string{"alpha.Undo", "beta.Undo"} {
		t.Run(step, func(t *testing.T) {
			armed := false
			fault := func(s string) error {
				if s == step && armed {
					armed = false
					return errors.New("injected")
				}
				return nil
			}
			r := newRig(t, t.TempDir(), fault)
			if err := r.prepare(); err != nil {
				t.Fatal(err)
			}
			armed = true
			if err := r.unprepare(); err == nil {
				t.Fatal("unprepare succeeded despite the failing undo")
			}
			state, _ := r.store.Read(context.Background())
			if state.Claims[string(testClaim().UID)] == nil {
				t.Fatal("a failed undo dropped the record: what is left would have no owner")
			}
			if err := r.unprepare(); err != nil {
				t.Fatalf("retried unprepare: %v", err)
			}
			r.checkClean()
		})
	}
}

// preparerWithFaults gives the rig's preparer the same fault hook for its
// own steps.
func preparerWithFaults(r *rig, fault func(string) error) *preparer.Preparer {
	confs := []preparer.Configurator{r.confs[0], r.confs[1]}
	return preparer.New(preparer.Config{DriverName: driverName, NodeName: nodeName, Store: r.store, CDI: r.cdi, Node: fakeNode{},
		Configurators: confs, Faults: func(s preparer.Step, _ string) error { return fault(string(s)) }})
}

const (
	killDirEnv  = "GPUDRA_PREPARER_KILL_DIR"
	killStepEnv = "GPUDRA_PREPARER_KILL_STEP"
	killOpEnv   = "GPUDRA_PREPARER_KILL_OP"
)

// TestKillHelperProcess is not a test: it is the process the kill test
// starts, which SIGKILLs itself at the given step.
func TestKillHelperProcess(t *testing.T) {
	dir, step, op := os.Getenv(killDirEnv), os.Getenv(killStepEnv), os.Getenv(killOpEnv)
	if dir == "" {
		t.Skip("helper process for TestKilledAtEachStep")
	}
	die := func(s string) error {
		if s == step {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	r := newRig(t, dir, die)
	r.prep = preparerWithFaults(r, die)
	var err error
	if op == "unprepare" {
		err = r.unprepare()
	} else {
		err = r.prepare()
	}
	t.Fatalf("the helper process survived its own kill (err %v)", err)
}

// TestKilledAtEachStep kills a process preparing a claim of two
// configurators at each step of Plan, Apply and Undo, and of the preparer,
// then starts anew on the same files (hardware outlives the process): the
// kubelet's retry prepares the claim in full with one set of hardware,
// and Unprepare (itself killed during each Undo, and retried) leaves
// nothing.
func TestKilledAtEachStep(t *testing.T) {
	kill := func(t *testing.T, dir, op, step string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillHelperProcess$")
		cmd.Env = append(os.Environ(), killDirEnv+"="+dir, killStepEnv+"="+step, killOpEnv+"="+op)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("helper was not killed at %s (%v):\n%s", step, err, out)
		}
	}
	for _, step := range steps {
		t.Run("prepare/"+step, func(t *testing.T) {
			dir := t.TempDir()
			kill(t, dir, "prepare", step)
			r := newRig(t, dir, nil)
			if err := r.prepare(); err != nil {
				t.Fatalf("retry after the kill: %v", err)
			}
			r.checkPrepared()
			if err := r.unprepare(); err != nil {
				t.Fatal(err)
			}
			r.checkClean()
		})
	}
	for _, step := range []string{"alpha.Undo", "beta.Undo"} {
		t.Run("unprepare/"+step, func(t *testing.T) {
			dir := t.TempDir()
			r := newRig(t, dir, nil)
			if err := r.prepare(); err != nil {
				t.Fatal(err)
			}
			_ = r.store.Close()
			kill(t, dir, "unprepare", step)
			r = newRig(t, dir, nil)
			state, err := r.store.Read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if state.Claims[string(testClaim().UID)] == nil {
				t.Fatal("the killed unprepare lost the record before its undo finished")
			}
			if err := r.unprepare(); err != nil {
				t.Fatalf("retried unprepare: %v", err)
			}
			r.checkClean()
		})
	}
}

// TestKilledAtEachStepThenCheckpointLost kills a preparation at each step,
// as TestKilledAtEachStep does, and then loses checkpoint.json before the
// plugin starts again. What the killed preparation set up must still have
// an owner: an Unprepare (the pod was deleted) leaves nothing, and so does
// a retry followed by an Unprepare. Before start records had files of
// their own, a preparation killed between its Apply and its CDI spec left
// its setup to no one once the checkpoint was gone.
func TestKilledAtEachStepThenCheckpointLost(t *testing.T) {
	kill := func(t *testing.T, dir, step string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillHelperProcess$")
		cmd.Env = append(os.Environ(), killDirEnv+"="+dir, killStepEnv+"="+step, killOpEnv+"=prepare")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("helper was not killed at %s (%v):\n%s", step, err, out)
		}
		if err := os.Remove(filepath.Join(dir, "plugin", checkpoint.FileName)); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range steps {
		t.Run("unprepare/"+step, func(t *testing.T) {
			dir := t.TempDir()
			kill(t, dir, step)
			r := newRig(t, dir, nil)
			if err := r.unprepare(); err != nil {
				t.Fatalf("unprepare after the kill and the loss: %v", err)
			}
			r.checkClean()
			if found, err := r.store.Started(); err != nil || len(found.Claims) != 0 {
				t.Errorf("start record files left: %v, %v", found.Claims, err)
			}
		})
		t.Run("retry/"+step, func(t *testing.T) {
			dir := t.TempDir()
			kill(t, dir, step)
			r := newRig(t, dir, nil)
			if err := r.prep.Restore(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := r.prepare(); err != nil {
				t.Fatalf("retry after the kill and the loss: %v", err)
			}
			r.checkPrepared()
			if err := r.unprepare(); err != nil {
				t.Fatal(err)
			}
			r.checkClean()
		})
	}
}

// TestStartRecordFileLifetime: a preparation's start record file exists
// while its configurators apply, and is gone once the claim is prepared,
// and once a failed preparation is rolled back.
func TestStartRecordFileLifetime(t *testing.T) {
	dir := t.TempDir()
	var seen []string
	var r *rig
	fault := func(step string) error {
		if step == "alpha.Apply" || step == "beta.Apply" {
			found, err := r.store.Started()
			if err != nil {
				return err
			}
			seen = append(seen, fmt.Sprintf("%s:%d", step, len(found.Claims)))
		}
		if step == "beta.Apply" && len(seen) == 2 {
			return errors.New("beta fails once")
		}
		return nil
	}
	r = newRig(t, dir, fault)
	if err := r.prepare(); err == nil {
		t.Fatal("the first prepare succeeded; want beta's failure")
	}
	if found, err := r.store.Started(); err != nil || len(found.Claims) != 0 {
		t.Errorf("after the rollback: start record files %v, %v; want none", found.Claims, err)
	}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	if found, err := r.store.Started(); err != nil || len(found.Claims) != 0 {
		t.Errorf("after the prepare: start record files %v, %v; want none", found.Claims, err)
	}
	if want := []string{"alpha.Apply:1", "beta.Apply:1", "alpha.Apply:1", "beta.Apply:1"}; !slices.Equal(seen, want) {
		t.Errorf("start record files seen during Apply: %v, want %v", seen, want)
	}
}
