package vfio_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

func TestBind(t *testing.T) {
	tests := map[string]struct {
		setup   []func(*fakesysfs.Builder)
		opts    []vfio.Option
		gpu     string
		want    map[string]fakesysfs.Binding
		modules []string // loaded afterwards
	}{
		"GPU and its audio function to vfio-pci": {
			gpu:     gpu,
			want:    bound(vfio.VFIOPCI),
			modules: []string{vfio.VFIOPCI},
		},
		"Grace: the GPU to nvgrace-gpu-vfio-pci, its audio function to vfio-pci": {
			opts:    []vfio.Option{vfio.WithGPUDriver(vfio.NVGraceGPUVFIOPCI)},
			gpu:     gpu,
			want:    bound(vfio.NVGraceGPUVFIOPCI),
			modules: []string{vfio.VFIOPCI, vfio.NVGraceGPUVFIOPCI},
		},
		"GPU alone in its group; the other GPU untouched": {
			gpu: otherGPU,
			want: func() map[string]fakesysfs.Binding {
				w := maps.Clone(original)
				w[otherGPU] = fakesysfs.Binding{Driver: vfio.VFIOPCI, Override: vfio.VFIOPCI}
				return w
			}(),
			modules: []string{vfio.VFIOPCI},
		},
		"vfio-pci built in: no module to load": {
			setup: []func(*fakesysfs.Builder){func(b *fakesysfs.Builder) {
				b.Driver(fakesysfs.Driver{Name: vfio.VFIOPCI, VFIO: true, Loaded: true})
			}},
			gpu:  gpu,
			want: bound(vfio.VFIOPCI),
		},
		"a bridge in the group keeps pcieport": {
			setup: []func(*fakesysfs.Builder){func(b *fakesysfs.Builder) {
				b.Function(fakesysfs.Function{BusID: "0000:1a:00.0", Vendor: "8086", Device: "347a", Class: "060400", IOMMUGroup: gpuGroup, Driver: "pcieport"})
			}},
			gpu: gpu,
			want: func() map[string]fakesysfs.Binding {
				w := bound(vfio.VFIOPCI)
				w["0000:1a:00.0"] = fakesysfs.Binding{Driver: "pcieport"}
				return w
			}(),
			modules: []string{vfio.VFIOPCI},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fake := node(t, tc.setup...)
			before := fake.Bindings()
			if len(tc.modules) > 0 {
				// Prove that Bind, not the fixture, loads the modules.
				for _, m := range tc.modules {
					if fake.DriverLoaded(m) {
						t.Fatalf("fixture has %s loaded already", m)
					}
				}
			} else {
				fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpLoadModule, Err: errors.New("must not load modules")})
			}
			b := binder(t, fake, tc.opts...)
			rec := plan(t, b, tc.gpu)
			if got := fake.Bindings(); !maps.Equal(got, before) {
				t.Fatalf("Plan changed bindings: %v", got)
			}
			if err := b.Bind(context.Background(), rec); err != nil {
				t.Fatalf("Bind: %v", err)
			}
			assertBindings(t, fake, tc.want)
			for _, m := range tc.modules {
				if !fake.DriverLoaded(m) {
					t.Errorf("module %s not loaded", m)
				}
			}
			for _, f := range rec.Functions {
				if _, ok := fake.VFIODevice(f.BusID); !ok {
					t.Errorf("function %s has no VFIO device node after Bind", f.BusID)
				}
			}

			// Bind again: nothing left to do.
			writes := fake.Writes()
			if err := b.Bind(context.Background(), rec); err != nil {
				t.Fatalf("second Bind: %v", err)
			}
			if n := fake.Writes() - writes; n != 0 {
				t.Errorf("second Bind wrote %d times, want 0", n)
			}

			if err := b.Restore(context.Background(), rec); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			assertBindings(t, fake, before)
			if groups := fake.VFIOGroups(); len(groups) != 0 {
				t.Errorf("VFIO group nodes %v left after Restore", groups)
			}
		})
	}
}

// TestBindFailureRollsBack breaks Bind at every step it takes and checks
// that the group ends up exactly as it was.
func TestBindFailureRollsBack(t *testing.T) {
	eio := syscall.EIO
	fault := func(op fakesysfs.Op, path string, skip int) func(*fakesysfs.Sysfs) {
		return func(f *fakesysfs.Sysfs) {
			f.InjectFault(fakesysfs.Fault{Op: op, Path: path, Err: eio, Skip: skip, Times: 1})
		}
	}
	tests := map[string]struct {
		setup  func(*fakesysfs.Sysfs)
		wantIs error
		want   string // part of the error
	}{
		"GPU held: refused, naming the holders": {
			setup: func(f *fakesysfs.Sysfs) {
				_ = f.SetHolders(gpu, "nvidia-persistenced (pid 812)", "nv-fabricmanager (pid 901)")
			},
			wantIs: vfio.ErrBusy,
			want:   "GPU 0000:1b:00.0 is in use by nvidia-persistenced (pid 812), nv-fabricmanager (pid 901)",
		},
		"busy check fails": {
			setup:  fault(fakesysfs.OpHolders, gpu, 0),
			wantIs: eio,
			want:   "check whether GPU 0000:1b:00.0 is in use",
		},
		"module load fails": {
			setup:  fault(fakesysfs.OpLoadModule, vfio.VFIOPCI, 0),
			wantIs: eio,
			want:   "load module vfio-pci",
		},
		"module loads but registers no such driver": {
			setup: func(f *fakesysfs.Sysfs) {
				f.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpLoadModule, Drop: true})
			},
			want: "module vfio-pci loaded, but no driver vfio-pci appeared (bus/pci/drivers/vfio-pci is missing)",
		},
		"reading a function's driver fails": {
			setup:  fault(fakesysfs.OpReadlink, "bus/pci/devices/"+audio+"/driver", 0),
			wantIs: eio,
			want:   "function 0000:1b:00.1: read driver",
		},
		"setting the GPU's driver_override fails": {
			setup:  fault(fakesysfs.OpWrite, "bus/pci/devices/"+gpu+"/driver_override", 0),
			wantIs: eio,
			want:   "function 0000:1b:00.0: set driver_override to vfio-pci: write /sys/bus/pci/devices/0000:1b:00.0/driver_override",
		},
		"unbinding the GPU fails": {
			setup:  fault(fakesysfs.OpWrite, "bus/pci/devices/"+gpu+"/driver/unbind", 0),
			wantIs: eio,
			want:   "function 0000:1b:00.0: unbind from nvidia: write /sys/bus/pci/devices/0000:1b:00.0/driver/unbind",
		},
		"binding the GPU fails": {
			setup:  fault(fakesysfs.OpWrite, "bus/pci/drivers/vfio-pci/bind", 0),
			wantIs: eio,
			want:   "function 0000:1b:00.0: bind to vfio-pci: write /sys/bus/pci/drivers/vfio-pci/bind",
		},
		"the GPU's probe declines silently": {
			setup: func(f *fakesysfs.Sysfs) {
				f.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpWrite, Path: "bus/pci/drivers/vfio-pci/bind", Drop: true, Times: 1})
			},
			want: `function 0000:1b:00.0: verify binding: bound to "" after binding to vfio-pci`,
		},
		"setting the audio function's driver_override fails, the GPU done": {
			setup:  fault(fakesysfs.OpWrite, "bus/pci/devices/"+audio+"/driver_override", 0),
			wantIs: eio,
			want:   "function 0000:1b:00.1: set driver_override to vfio-pci",
		},
		"audio function held by a sound server: unbind busy": {
			setup: func(f *fakesysfs.Sysfs) {
				_ = f.SetHolders(audio, "pipewire (pid 77)")
			},
			wantIs: syscall.EBUSY,
			want:   "function 0000:1b:00.1: unbind from snd_hda_intel: write /sys/bus/pci/devices/0000:1b:00.1/driver/unbind: device or resource busy",
		},
		"binding the audio function fails, the GPU done": {
			setup:  fault(fakesysfs.OpWrite, "bus/pci/drivers/vfio-pci/bind", 1),
			wantIs: eio,
			want:   "function 0000:1b:00.1: bind to vfio-pci",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fake := node(t)
			b := binder(t, fake)
			rec := plan(t, b, gpu)
			tc.setup(fake)
			err := b.Bind(context.Background(), rec)
			if err == nil {
				t.Fatal("Bind succeeded")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Bind error %q does not wrap %v", err, tc.wantIs)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Bind error\n%s\nlacks %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "roll back") {
				t.Errorf("rollback failed: %v", err)
			}
			assertBindings(t, fake, original)
			if groups := fake.VFIOGroups(); len(groups) != 0 {
				t.Errorf("VFIO group nodes %v left after rollback", groups)
			}
		})
	}
}

func TestBindContext(t *testing.T) {
	t.Run("cancelled midway: rolled back", func(t *testing.T) {
		fake := node(t)
		b := binder(t, fake)
		rec := plan(t, b, gpu)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fake.OnWrite(func(name string) {
			if name == "bus/pci/devices/"+gpu+"/driver/unbind" {
				cancel()
			}
		})
		err := b.Bind(ctx, rec)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Bind = %v, want context.Canceled", err)
		}
		// Cancelled as the unbind returns: Bind gives up on the unbind,
		// or does not start the bind, depending on which it sees first.
		if !strings.Contains(err.Error(), "function 0000:1b:00.0: bind to vfio-pci: not started") &&
			!strings.Contains(err.Error(), "function 0000:1b:00.0: unbind from nvidia: sysfs write still in progress, gave up") {
			t.Errorf("Bind error %q names neither the unbind nor the bind of the GPU", err)
		}
		assertBindings(t, fake, original)
	})
	t.Run("deadline passed: nothing done", func(t *testing.T) {
		fake := node(t)
		b := binder(t, fake)
		rec := plan(t, b, gpu)
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		if err := b.Bind(ctx, rec); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Bind = %v, want context.DeadlineExceeded", err)
		}
		assertBindings(t, fake, original)
		if n := fake.Writes(); n != 0 {
			t.Errorf("%d writes after the deadline", n)
		}
	})
}

func TestBindRefusesChangedGroup(t *testing.T) {
	t.Run("function gone since Plan", func(t *testing.T) {
		rec := plan(t, binder(t, node(t)), gpu)
		other, err := fakesysfs.NewBuilder().Function(fakesysfs.Function{
			BusID: gpu, Vendor: "10de", Device: "26b1", Class: "030000", IOMMUGroup: gpuGroup, Driver: "nvidia",
		}).Build()
		if err != nil {
			t.Fatal(err)
		}
		err = binder(t, other).Bind(context.Background(), rec)
		if want := "IOMMU group 27 now holds [0000:1b:00.0], not the planned [0000:1b:00.0 0000:1b:00.1]"; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Bind = %v, want %q", err, want)
		}
		assertBindings(t, other, map[string]fakesysfs.Binding{gpu: {Driver: "nvidia"}})
	})
	t.Run("function taken by a third driver since Plan", func(t *testing.T) {
		fake := node(t, func(b *fakesysfs.Builder) {
			b.Driver(fakesysfs.Driver{Name: "other_audio", Loaded: true, Matches: []fakesysfs.Match{{ClassPrefix: "0403"}}})
		})
		b := binder(t, fake)
		rec := plan(t, b, gpu)
		for _, w := range [][2]string{{"bus/pci/devices/" + audio + "/driver/unbind", audio}, {"bus/pci/drivers/other_audio/bind", audio}} {
			if err := fake.WriteFile(w[0], []byte(w[1])); err != nil {
				t.Fatal(err)
			}
		}
		err := b.Bind(context.Background(), rec)
		if want := `function 0000:1b:00.1 is bound to other_audio, neither its original driver "snd_hda_intel" nor vfio-pci`; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Bind = %v, want %q", err, want)
		}
		want := maps.Clone(original)
		want[audio] = fakesysfs.Binding{Driver: "other_audio"}
		assertBindings(t, fake, want)
	})
}

func TestNewBinder(t *testing.T) {
	fake := node(t)
	if _, err := vfio.NewBinder(nil, fake, fake); err == nil {
		t.Error("NewBinder without sysfs succeeded")
	}
	if _, err := vfio.NewBinder(fake, fake, fake, vfio.WithGPUDriver("../evil")); err == nil {
		t.Error("NewBinder with a path as driver succeeded")
	}
}

// TestBindStuckUnbind lets the GPU's unbind hang in the kernel past the
// deadline, as it does while a process the busy check missed holds the GPU.
func TestBindStuckUnbind(t *testing.T) {
	fake := node(t)
	b := binder(t, fake, vfio.WithRollbackTimeout(50*time.Millisecond))
	rec := plan(t, b, gpu)
	release := make(chan struct{})
	fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpWrite, Path: "bus/pci/devices/" + gpu + "/driver/unbind", Block: release, Times: 1})

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := b.Bind(ctx, rec)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Bind took %s with a 50ms deadline and a 50ms rollback", elapsed)
	}
	if !errors.Is(err, vfio.ErrInFlight) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Bind = %v, want ErrInFlight after the deadline", err)
	}
	if want := "function 0000:1b:00.0: unbind from nvidia: sysfs write still in progress, gave up: context deadline exceeded"; !strings.Contains(err.Error(), want) {
		t.Errorf("Bind error %q lacks %q", err, want)
	}
	if want := "roll back: function 0000:1b:00.0: not restored: sysfs write still in progress (unbind from nvidia)"; !strings.Contains(err.Error(), want) {
		t.Errorf("Bind error %q lacks %q", err, want)
	}

	// The holder lets go; the unbind completes in the background, and
	// Restore, waiting for it, puts the GPU back.
	close(release)
	if err := b.Restore(context.Background(), rec); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	assertBindings(t, fake, original)
}
