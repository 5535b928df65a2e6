package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// callsOf runs op on a fresh rig and returns how often it called each NVML
// function.
func callsOf(t *testing.T, op func(r *rig) error) map[string]int {
	t.Helper()
	r := newRig(t, "H100-SXM5-80GB", true)
	if err := op(r); err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, name := range nvmlCalls {
		if n := r.faults.Calls(name); n > 0 {
			calls[name] = n
		}
	}
	return calls
}

// A failure of any NVML call CreateMIGDevice makes, at any of its calls,
// fails the creation with an error naming the call and NVML's error, and
// leaves neither a GPU instance nor a compute instance behind.
func TestCreateRollsBackAtEveryStep(t *testing.T) {
	place := func(r *rig) hardware.MIGPlacement { return r.at(14, 2) }
	create := func(r *rig) error {
		_, err := r.hw.CreateMIGDevice(context.Background(), place(r))
		return err
	}
	calls := callsOf(t, create)
	if calls["nvmlGpuInstanceCreateComputeInstance"] != 1 || calls["nvmlDeviceCreateGpuInstanceWithPlacement"] != 1 {
		t.Fatalf("a clean creation made calls %v", calls)
	}
	cases := 0
	for name, count := range calls {
		if name == "nvmlShutdown" { // after the work; see TestCreateSurvivesShutdownFailure
			continue
		}
		for k := 1; k <= count; k++ {
			cases++
			r := newRig(t, "H100-SXM5-80GB", true)
			r.faults.Fail(name, k, nvml.ERROR_UNKNOWN)
			err := create(r)
			if err == nil || !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), strings.TrimSuffix(name, "WithFlags")) ||
				!strings.Contains(err.Error(), place(r).String()) {
				t.Errorf("%s failing at call %d: got %v, want an error naming the placement, the call and %v", name, k, err, nvml.ERROR_UNKNOWN)
			}
			if strings.Contains(err.Error(), "roll back") {
				t.Errorf("%s failing at call %d: the roll-back failed: %v", name, k, err)
			}
			if got := r.instances(t); got != nil {
				t.Errorf("%s failing at call %d left %v", name, k, got)
			}
			if g := r.discover(t); g.MIGDevices != nil {
				t.Errorf("%s failing at call %d: discovered %+v", name, k, g.MIGDevices)
			}
			if err := create(r); err != nil {
				t.Errorf("%s failing at call %d: creating again: %v", name, k, err)
			}
		}
	}
	t.Logf("%d failure points", cases)
}

// When the roll-back fails too, the error says so and names what is left;
// DestroyMIGDevice clears it.
func TestCreateRollBackFailure(t *testing.T) {
	tests := []struct {
		name  string
		fail  []string // each call fails once, the first time
		want  string
		state []string
	}{
		{"GPU instance left", []string{"nvmlGpuInstanceCreateComputeInstance", "nvmlGpuInstanceDestroy"},
			"(roll back: nvmlGpuInstanceDestroy: " + nvml.ERROR_GPU_IS_LOST.Error() + "; the GPU instance is left)", []string{"14@2/0"}},
		{"both left", []string{"nvmlDeviceGetMaxMigDeviceCount", "nvmlComputeInstanceDestroy"},
			"(roll back: nvmlComputeInstanceDestroy: " + nvml.ERROR_GPU_IS_LOST.Error() + "; the compute instance and the GPU instance are left)", []string{"14@2/1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "H100-SXM5-80GB", true)
			for _, call := range tt.fail {
				r.faults.Fail(call, 1, nvml.ERROR_GPU_IS_LOST)
			}
			_, err := r.hw.CreateMIGDevice(context.Background(), r.at(14, 2))
			if err == nil || !strings.HasSuffix(err.Error(), tt.want) {
				t.Errorf("got %v, want an error ending %q", err, tt.want)
			}
			if got := r.instances(t); !slices.Equal(got, tt.state) {
				t.Errorf("left %v, want %v", got, tt.state)
			}
			if err := r.hw.DestroyMIGDevice(context.Background(), r.at(14, 2)); err != nil || r.instances(t) != nil {
				t.Errorf("clean-up: %v, left %v", err, r.instances(t))
			}
		})
	}
}

// A failing nvmlShutdown does not undo or hide a creation that worked.
func TestCreateSurvivesShutdownFailure(t *testing.T) {
	r := newRig(t, "H100-SXM5-80GB", true)
	r.faults.Fail("nvmlShutdown", 1, nvml.ERROR_UNKNOWN)
	mig, err := r.hw.CreateMIGDevice(context.Background(), r.at(19, 0))
	if err != nil || mig.UUID == "" {
		t.Fatalf("got %+v, %v", mig, err)
	}
	if got := r.instances(t); !slices.Equal(got, []string{"19@0/1"}) {
		t.Errorf("instances %v", got)
	}
}

// cancelAfter is a context whose Err reports cancellation from its n+1-th
// call on: a cancellation that arrives between two steps.
type cancelAfter struct {
	context.Context
	left atomic.Int32
}

func (c *cancelAfter) Err() error {
	if c.left.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// A context cancelled between any two steps stops the creation and rolls
// back what was made.
func TestCreateCancelled(t *testing.T) {
	for n := int32(0); ; n++ {
		r := newRig(t, "A100-SXM4-40GB", true)
		ctx := &cancelAfter{Context: context.Background()}
		ctx.left.Store(n)
		_, err := r.hw.CreateMIGDevice(ctx, r.at(9, 4))
		if err == nil {
			if n < 3 {
				t.Errorf("only %d checks of the context", n)
			}
			if got := r.instances(t); !slices.Equal(got, []string{"9@4/1"}) {
				t.Errorf("instances %v after a creation", got)
			}
			return
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled after %d checks: got %v", n, err)
		}
		if got := r.instances(t); got != nil {
			t.Errorf("cancelled after %d checks: left %v", n, got)
		}
	}
}

// A failure while destroying leaves what could not be destroyed for a
// retry, and says which call failed.
func TestDestroyFailures(t *testing.T) {
	for _, call := range []string{"nvmlDeviceGetGpuInstances", "nvmlGpuInstanceGetComputeInstances", "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"} {
		t.Run(call, func(t *testing.T) {
			r := newRig(t, "H100-SXM5-80GB", true)
			if _, err := r.hw.CreateMIGDevice(context.Background(), r.at(9, 0)); err != nil {
				t.Fatal(err)
			}
			r.faults.Fail(call, 1, nvml.ERROR_IN_USE)
			err := r.hw.DestroyMIGDevice(context.Background(), r.at(9, 0))
			if !errors.Is(err, nvml.ERROR_IN_USE) || !strings.Contains(err.Error(), call) {
				t.Errorf("got %v, want an error naming %s", err, call)
			}
			if r.instances(t) == nil {
				t.Error("the GPU instance went despite the failure")
			}
			if err := r.hw.DestroyMIGDevice(context.Background(), r.at(9, 0)); err != nil || r.instances(t) != nil {
				t.Errorf("retry: %v, left %v", err, r.instances(t))
			}
		})
	}
}

// Fail refuses what could never fire, so that a typo cannot pass a test.
func TestFaultsRejectMisuse(t *testing.T) {
	for _, tt := range []struct {
		call string
		n    int
		ret  nvml.Return
	}{
		{"nvmlDeviceCreateGpuInstance", 1, nvml.ERROR_UNKNOWN},
		{"CreateGpuInstanceWithPlacement", 1, nvml.ERROR_UNKNOWN},
		{"nvmlGpuInstanceDestroy", 0, nvml.ERROR_UNKNOWN},
		{"nvmlGpuInstanceDestroy", 1, nvml.SUCCESS},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Fail(%q, %d, %v) did not panic", tt.call, tt.n, tt.ret)
				}
			}()
			(&Faults{}).Fail(tt.call, tt.n, tt.ret)
		}()
	}
}

// Every function NVMLCalls names is served, and counted, by the fake.
//
//nolint:errcheck // The NVML calls are made only to be counted.
func TestFaultsCountEveryCall(t *testing.T) {
	r := newRig(t, "H100-SXM5-80GB", true)
	ctx := context.Background()
	if _, err := r.hw.CreateMIGDevice(ctx, r.at(19, 0)); err != nil {
		t.Fatal(err)
	}
	r.instances(t)
	r.discover(t)
	if err := r.hw.DestroyMIGDevice(ctx, r.at(19, 0)); err != nil {
		t.Fatal(err)
	}
	if err := r.hw.SetMIGMode(ctx, r.gpu, false); err != nil {
		t.Fatal(err)
	}
	// What neither nvmlhw nor the helpers above call.
	r.nv.Init()
	r.nv.SystemGetDriverVersion()
	dev := r.nv.devices[0]
	dev.GetIndex()
	info := dev.model.MIGProfiles[0].giInfo()
	dev.GetGpuInstanceRemainingCapacity(&info)
	fleet, err := loadFleet("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	nv := newFakeNVML(&fleet.Nodes[0], WithFaults(r.faults))
	m, _ := nv.devices[0].GetMigDeviceHandleByIndex(0)
	m.GetName()
	m.GetMemoryInfo()
	m.GetAttributes()
	m.GetDeviceHandleFromMigDeviceHandle()
	m.IsMigDeviceHandle()
	// Health: what nvmlhw's watcher calls.
	set, _ := r.nv.EventSetCreate()
	dev.RegisterEvents(supportedEvents, set)
	dev.GetSupportedEventTypes()
	dev.GetFieldValues(make([]nvml.FieldValue, 1))
	set.Wait(1)
	set.Free()
	for _, name := range NVMLCalls() {
		if r.faults.Calls(name) == 0 {
			t.Errorf("%s was never counted", name)
		}
	}
}

// The hardware of Node.Hardware counts in the Faults it is given and
// fails as they say.
func TestHardwareWithFaults(t *testing.T) {
	f, err := loadFleet("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	faults := &Faults{}
	hw := f.Nodes[0].Hardware(WithFaults(faults))
	faults.Fail("nvmlDeviceGetName", 2, nvml.ERROR_GPU_IS_LOST)
	inv, err := hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 7 || len(inv.Problems) != 1 || inv.Problems[0].Index != 1 {
		t.Errorf("got %d GPUs, problems %+v; want GPU 1 left out", len(inv.GPUs), inv.Problems)
	}
	if got := faults.Calls("nvmlDeviceGetName"); got != 8 {
		t.Errorf("nvmlDeviceGetName called %d times, want 8", got)
	}
}
