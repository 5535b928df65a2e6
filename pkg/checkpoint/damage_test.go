package checkpoint

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// damages are the ways checkpoint.json gets lost under a running Store.
var damages = []struct {
	name string
	// damage breaks the file; movedAside says whether the Store then
	// finds something to move aside.
	damage     func(tb testing.TB, path string)
	movedAside bool
	wantErr    string
}{
	{"garbage", func(tb testing.TB, path string) {
		if err := lockedfile.Write(path, []byte("{garbage")); err != nil {
			tb.Fatal(err)
		}
	}, true, "invalid character"},
	{"truncated in place", func(tb testing.TB, path string) {
		if err := os.Truncate(path, 10); err != nil {
			tb.Fatal(err)
		}
	}, true, "unexpected end of JSON input"},
	{"replaced by a directory", func(tb testing.TB, path string) {
		if err := os.Remove(path); err != nil {
			tb.Fatal(err)
		}
		if err := os.Mkdir(path, 0o700); err != nil {
			tb.Fatal(err)
		}
	}, true, "is a directory, not a regular file"},
	{"replaced by a dangling symbolic link", func(tb testing.TB, path string) {
		if err := os.Remove(path); err != nil {
			tb.Fatal(err)
		}
		if err := os.Symlink(path+".gone", path); err != nil {
			tb.Fatal(err)
		}
	}, true, "symbolic link to a missing file"},
	{"deleted", func(tb testing.TB, path string) {
		if err := os.Remove(path); err != nil {
			tb.Fatal(err)
		}
	}, false, "disappeared while in use"},
}

// TestDamageWhileRunning is the regression test of a chaos-run finding: a
// checkpoint damaged while the plugin ran left the Store empty, and the
// next Prepare checked its conflicts against that empty state. Now every
// call fails with ErrNeedsAdoption, without running its mutation, until
// the owner recovers; the fast path of Read and View too.
func TestDamageWhileRunning(t *testing.T) {
	for _, d := range damages {
		for _, foundBy := range []string{"Update", "Read", "View"} {
			t.Run(d.name+"/found by "+foundBy, func(t *testing.T) {
				e := newTestEnv(t)
				var log corruptLog
				s, _ := e.open(t, log.option())
				ctx := t.Context()
				if err := s.Update(ctx, addClaim(testClaim("held"))); err != nil {
					t.Fatal(err)
				}
				if got := mustRead(t, s); got.Claims["held"] == nil { // warm the fast path
					t.Fatal("claim held missing")
				}
				d.damage(t, e.path())

				ran := false
				update := func() error {
					return s.Update(ctx, func(st *claimstate.State) error { ran = true; return nil })
				}
				read := func() error { _, err := s.Read(ctx); return err }
				view := func() error {
					return s.View(ctx, func(*claimstate.State) error { ran = true; return nil })
				}
				first := map[string]func() error{"Update": update, "Read": read, "View": view}[foundBy]
				for i, call := range []func() error{first, update, read, view} {
					if err := call(); !errors.Is(err, ErrNeedsAdoption) {
						t.Errorf("call %d after the damage = %v, want ErrNeedsAdoption", i, err)
					}
				}
				if ran {
					t.Error("a mutation or view ran on the lost state")
				}
				if !s.NeedsAdoption() || !exists(t, e.markerPath()) {
					t.Errorf("NeedsAdoption = %v, marker there = %v; want both", s.NeedsAdoption(), exists(t, e.markerPath()))
				}
				files := log.get()
				if len(files) != 1 || !strings.Contains(files[0].Err.Error(), d.wantErr) {
					t.Fatalf("corrupt handler got %+v, want one call with %q", files, d.wantErr)
				}
				if disappeared := errors.Is(files[0].Err, ErrDisappeared); disappeared == d.movedAside {
					t.Errorf("corrupt handler's error %v: errors.Is(ErrDisappeared) = %v, want %v", files[0].Err, disappeared, !d.movedAside)
				}
				if kept := movedAside(t, e.dir); d.movedAside != (len(kept) == 1 && files[0].Path == kept[0]) {
					t.Errorf("moved-aside files %v, handler told %q", kept, files[0].Path)
				}

				err := s.Recover(ctx, func(st *claimstate.State) error {
					if len(st.Claims) != 0 {
						t.Errorf("Recover sees %v, want an empty state", st.Claims)
					}
					st.Claims["held"] = testClaim("held") // adopted
					return nil
				})
				if err != nil {
					t.Fatalf("Recover: %v", err)
				}
				if s.NeedsAdoption() || exists(t, e.markerPath()) {
					t.Errorf("after Recover NeedsAdoption = %v, marker there = %v; want neither", s.NeedsAdoption(), exists(t, e.markerPath()))
				}
				if err := s.Update(ctx, addClaim(testClaim("later"))); err != nil {
					t.Fatalf("Update after Recover: %v", err)
				}
				if got := mustRead(t, s); len(got.Claims) != 2 || got.Claims["held"] == nil || got.Claims["later"] == nil {
					t.Errorf("state = %v, want held and later", got.Claims)
				}
				if n := len(log.get()); n != 1 {
					t.Errorf("corrupt handler called %d times, want once", n)
				}
				_ = s.Close()
				if _, report := e.open(t); report != (OpenReport{}) {
					t.Errorf("reopen report = %+v, want zero", report)
				}
			})
		}
	}
}

// TestNonRegularCheckpoint is the regression test of a crash loop: a
// checkpoint.json that is a directory made every start fail. Anything but a
// regular file is moved aside like an unreadable file.
func TestNonRegularCheckpoint(t *testing.T) {
	tests := []struct {
		name, wantErr string
		make          func(tb testing.TB, path string)
	}{
		{"directory", "is a directory", func(tb testing.TB, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				tb.Fatal(err)
			}
			writeFile(tb, filepath.Join(path, "inside"), "x")
		}},
		{"symlink to a directory", "is a directory", func(tb testing.TB, path string) {
			if err := os.Symlink(tb.TempDir(), path); err != nil {
				tb.Fatal(err)
			}
		}},
		{"symlink loop", "is a symbolic link", func(tb testing.TB, path string) {
			if err := os.Symlink(path, path); err != nil {
				tb.Fatal(err)
			}
		}},
		{"named pipe", "is a named pipe", func(tb testing.TB, path string) {
			if err := unix.Mkfifo(path, 0o600); err != nil {
				tb.Fatal(err)
			}
		}},
		{"socket", "is a socket", func(tb testing.TB, path string) {
			l, err := net.Listen("unix", path)
			if err != nil {
				tb.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			tb.Cleanup(func() { _ = l.Close() })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			tt.make(t, e.path())
			before, err := os.Lstat(e.path())
			if err != nil {
				t.Fatal(err)
			}
			s, report := e.open(t)
			if report.Corrupt == nil || !strings.Contains(report.Corrupt.Err.Error(), tt.wantErr+", not a regular file") {
				t.Fatalf("report = %+v, want Corrupt saying %q", report, tt.wantErr)
			}
			after, err := os.Lstat(report.Corrupt.Path)
			if err != nil || after.Mode().Type() != before.Mode().Type() {
				t.Errorf("moved aside to %s: %v, mode %v; want the original (mode %v)", report.Corrupt.Path, err, after, before.Mode())
			}
			if !s.NeedsAdoption() {
				t.Error("NeedsAdoption = false")
			}
			if err := s.Recover(t.Context(), addClaim(testClaim("adopted"))); err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			if _, report := e.open(t); report != (OpenReport{}) {
				t.Errorf("reopen report = %+v, want zero", report)
			}
		})
	}
}
