package vfio_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"syscall"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// persist round-trips rec through JSON, as the plugin's checkpoint does.
func persist(t *testing.T, rec vfio.Record) vfio.Record {
	t.Helper()
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var out vfio.Record
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// restoreAfterRestart restores rec as a restarted plugin would, twice, and
// checks that the node is as it was before Bind.
func restoreAfterRestart(t *testing.T, fake *fakesysfs.Sysfs, rec vfio.Record, opts ...vfio.Option) {
	t.Helper()
	fake.Restart()
	b := binder(t, fake, opts...)
	if err := b.Restore(context.Background(), rec); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	assertBindings(t, fake, original)
	if groups := fake.VFIOGroups(); len(groups) != 0 {
		t.Errorf("VFIO group nodes %v left after Restore", groups)
	}
	writes := fake.Writes()
	if err := b.Restore(context.Background(), rec); err != nil {
		t.Fatalf("second Restore: %v", err)
	}
	if n := fake.Writes() - writes; n != 0 {
		t.Errorf("second Restore wrote %d times, want 0", n)
	}
}

// TestRestoreAfterCrash crashes the plugin after every write of Bind, of
// Restore and of Bind's own rollback, and restores from the persisted
// record, as a restarted plugin does.
func TestRestoreAfterCrash(t *testing.T) {
	for name, opts := range map[string][]vfio.Option{
		"vfio-pci": nil,
		"Grace":    {vfio.WithGPUDriver(vfio.NVGraceGPUVFIOPCI)},
	} {
		t.Run(name, func(t *testing.T) {
			// A full Bind and a full Restore, to count their writes.
			fake := node(t)
			b := binder(t, fake, opts...)
			rec := plan(t, b, gpu)
			if err := b.Bind(context.Background(), rec); err != nil {
				t.Fatal(err)
			}
			bindWrites := fake.Writes()
			if err := b.Restore(context.Background(), rec); err != nil {
				t.Fatal(err)
			}
			restoreWrites := fake.Writes() - bindWrites
			if bindWrites != 6 || restoreWrites != 6 {
				t.Fatalf("Bind wrote %d times and Restore %d, want 6 each (override, unbind, bind per function)", bindWrites, restoreWrites)
			}

			for n := range bindWrites + 1 {
				fake := node(t)
				b := binder(t, fake, opts...)
				rec := persist(t, plan(t, b, gpu))
				fake.CrashAfterWrites(n)
				if err := b.Bind(context.Background(), rec); !errors.Is(err, fakesysfs.ErrCrashed) {
					t.Fatalf("Bind crashing after %d writes = %v, want the crash", n, err)
				}
				restoreAfterRestart(t, fake, rec, opts...)
			}

			for n := range restoreWrites {
				fake := node(t)
				b := binder(t, fake, opts...)
				rec := persist(t, plan(t, b, gpu))
				if err := b.Bind(context.Background(), rec); err != nil {
					t.Fatal(err)
				}
				fake.CrashAfterWrites(n)
				if err := b.Restore(context.Background(), rec); !errors.Is(err, fakesysfs.ErrCrashed) {
					t.Fatalf("Restore crashing after %d writes = %v, want the crash", n, err)
				}
				restoreAfterRestart(t, fake, rec, opts...)
			}

			// Bind fails at the audio function's bind, after 5 writes, and
			// its rollback takes 5 more (2 for the audio function, 3 for
			// the GPU). A crash after none of them is a crash of Bind,
			// tested above.
			for n := 1; n <= 5; n++ {
				fake := node(t)
				b := binder(t, fake, opts...)
				rec := persist(t, plan(t, b, gpu))
				fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpWrite, Path: "bus/pci/drivers/vfio-pci/bind", Err: syscall.EIO, Skip: 1})
				if name == "Grace" {
					// The GPU binds through nvgrace; the first vfio-pci
					// bind is the audio function's.
					fake.ClearFaults()
					fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpWrite, Path: "bus/pci/drivers/vfio-pci/bind", Err: syscall.EIO})
				}
				fake.CrashAfterWrites(5 + n)
				err := b.Bind(context.Background(), rec)
				if !errors.Is(err, syscall.EIO) || !errors.Is(err, fakesysfs.ErrCrashed) || !strings.Contains(err.Error(), "roll back") {
					t.Fatalf("Bind with its rollback crashing after %d writes = %v, want the bind failure and the crash in the rollback", n, err)
				}
				fake.ClearFaults()
				restoreAfterRestart(t, fake, rec, opts...)
			}
		})
	}
}

func TestRestore(t *testing.T) {
	withOverride := func(override string) func(*fakesysfs.Builder) {
		return func(b *fakesysfs.Builder) {
			b.Function(fakesysfs.Function{BusID: "0000:3d:00.0", Vendor: "10de", Device: "26b1", Class: "030000", IOMMUGroup: 50, Driver: "nvidia", DriverOverride: override})
		}
	}
	tests := map[string]struct {
		setup []func(*fakesysfs.Builder)
		gpu   string
		want  fakesysfs.Binding // of gpu after Restore
	}{
		"original driver_override naming the original driver": {
			setup: []func(*fakesysfs.Builder){withOverride("nvidia")},
			gpu:   "0000:3d:00.0",
			want:  fakesysfs.Binding{Driver: "nvidia", Override: "nvidia"},
		},
		"original driver_override naming another driver is put back after the bind": {
			setup: []func(*fakesysfs.Builder){withOverride("vfio-pci")},
			gpu:   "0000:3d:00.0",
			want:  fakesysfs.Binding{Driver: "nvidia", Override: "vfio-pci"},
		},
		"function without a driver stays without": {
			setup: []func(*fakesysfs.Builder){func(b *fakesysfs.Builder) {
				b.Function(fakesysfs.Function{BusID: "0000:3d:00.0", Vendor: "10de", Device: "2330", Class: "030200", IOMMUGroup: 50})
			}},
			gpu:  "0000:3d:00.0",
			want: fakesysfs.Binding{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fake := node(t, tc.setup...)
			before := fake.Bindings()
			b := binder(t, fake)
			rec := plan(t, b, tc.gpu)
			if err := b.Bind(context.Background(), rec); err != nil {
				t.Fatalf("Bind: %v", err)
			}
			if got, _ := fake.Binding(tc.gpu); got != (fakesysfs.Binding{Driver: vfio.VFIOPCI, Override: vfio.VFIOPCI}) {
				t.Fatalf("after Bind: %+v", got)
			}
			if err := b.Restore(context.Background(), rec); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if got, _ := fake.Binding(tc.gpu); got != tc.want {
				t.Errorf("after Restore: %+v, want %+v", got, tc.want)
			}
			assertBindings(t, fake, before)
		})
	}
}

func TestRestoreUntouched(t *testing.T) {
	fake := node(t)
	b := binder(t, fake)
	if err := b.Restore(context.Background(), plan(t, b, gpu)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if n := fake.Writes(); n != 0 {
		t.Errorf("Restore of an untouched group wrote %d times", n)
	}
}

func TestRestoreLeavesAThirdDriverAlone(t *testing.T) {
	fake := node(t, func(b *fakesysfs.Builder) {
		b.Driver(fakesysfs.Driver{Name: "other_audio", Loaded: true, Matches: []fakesysfs.Match{{ClassPrefix: "0403"}}})
	})
	b := binder(t, fake)
	rec := plan(t, b, gpu)
	if err := b.Bind(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	// Someone moves the audio function on.
	for _, w := range [][2]string{
		{"bus/pci/devices/" + audio + "/driver/unbind", audio},
		{"bus/pci/devices/" + audio + "/driver_override", "\n"},
		{"bus/pci/drivers/other_audio/bind", audio},
	} {
		if err := fake.WriteFile(w[0], []byte(w[1])); err != nil {
			t.Fatal(err)
		}
	}
	err := b.Restore(context.Background(), rec)
	if want := `function 0000:1b:00.1: bound to other_audio, neither its original driver "snd_hda_intel" nor vfio-pci: left as it is`; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Restore = %v, want %q", err, want)
	}
	want := maps.Clone(original)
	want[audio] = fakesysfs.Binding{Driver: "other_audio"}
	assertBindings(t, fake, want)
}

func TestRestoreCancelled(t *testing.T) {
	fake := node(t)
	b := binder(t, fake)
	rec := plan(t, b, gpu)
	if err := b.Bind(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake.OnWrite(func(string) { cancel() })
	if err := b.Restore(ctx, rec); !errors.Is(err, context.Canceled) {
		t.Fatalf("Restore = %v, want context.Canceled", err)
	}
	if got := fake.Bindings(); maps.Equal(got, original) {
		t.Fatal("a cancelled Restore finished anyway")
	}
	if err := b.Restore(context.Background(), rec); err != nil {
		t.Fatalf("second Restore: %v", err)
	}
	assertBindings(t, fake, original)
}

func TestRestoreRefusesInvalidRecord(t *testing.T) {
	fake := node(t)
	b := binder(t, fake)
	rec := vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{
		{BusID: gpu, Driver: "../../../../kernel/x", OriginalDriver: "nvidia"},
	}}
	if err := b.Restore(context.Background(), rec); err == nil || !strings.Contains(err.Error(), "invalid VFIO record") {
		t.Fatalf("Restore = %v, want an invalid record", err)
	}
	if n := fake.Writes(); n != 0 {
		t.Errorf("%d writes for an invalid record", n)
	}
}
