package imagebuild

import (
	"archive/tar"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCopyHostKeepsSymlinks: a file reached through symlinks is copied with
// every link on the way, as the links are on the host (Debian's merged
// /usr: /lib64 -> usr/lib64, and an absolute link from there to
// /lib/x86_64-linux-gnu).
func TestCopyHostKeepsSymlinks(t *testing.T) {
	root := t.TempDir()
	mustMkdir(t, root, "usr/lib/x86_64-linux-gnu", "usr/lib64")
	mustWrite(t, root, "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "loader")
	mustLink(t, root, "lib", "usr/lib")
	mustLink(t, root, "lib64", "usr/lib64")
	mustLink(t, root, "usr/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	mustLink(t, root, "loop", "loop")

	tr := tree{}
	if err := tr.copyHost(root, "/lib64/ld-linux-x86-64.so.2"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/lib64":                          "link usr/lib64",
		"/usr":                            "dir",
		"/usr/lib64":                      "dir",
		"/usr/lib64/ld-linux-x86-64.so.2": "link /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
		"/lib":                            "link usr/lib",
		"/usr/lib":                        "dir",
		"/usr/lib/x86_64-linux-gnu":       "dir",
		"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": "file",
	}
	got := map[string]string{}
	for p, e := range tr {
		switch e.typeflag {
		case tar.TypeDir:
			got[p] = "dir"
		case tar.TypeSymlink:
			got[p] = "link " + e.linkname
		case tar.TypeReg:
			got[p] = "file"
		}
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: got %q, want %q", p, got[p], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d entries %v, want %d", len(got), got, len(want))
	}

	if err := tr.copyHost(root, "/loop/x"); err == nil || !strings.Contains(err.Error(), "too many levels") {
		t.Errorf("symlink loop: got %v", err)
	}
	if err := tr.copyHost(root, "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2/x"); err == nil {
		t.Error("a path through a file: no error")
	}
}

// TestTarIsReproducible: the same tree gives the same bytes, whatever the
// order files were added in.
func TestTarIsReproducible(t *testing.T) {
	a, b := tree{}, tree{}
	a.file("/etc/passwd", []byte("root"), 0o644)
	a.file("/etc/group", []byte("root"), 0o644)
	b.file("/etc/group", []byte("root"), 0o644)
	b.file("/etc/passwd", []byte("root"), 0o644)
	ta, err := a.tar(time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	tb, err := b.tar(time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if string(ta) != string(tb) {
		t.Error("same files, different tars")
	}
}

// TestClosureOfNsenter: nsenter's libraries on Debian 12, found through
// the ELF dynamic sections.
func TestClosureOfNsenter(t *testing.T) {
	if _, err := os.Stat("/usr/bin/nsenter"); err != nil {
		t.Skip("no nsenter here:", err)
	}
	c := newClosure("/")
	if err := c.addExecutable("/usr/bin/nsenter"); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(c.paths, " ")
	for _, want := range []string{"ld-linux", "/libc.so.6", "/libselinux.so.1", "/libpcre2-8.so.0"} {
		if !strings.Contains(joined, want) {
			t.Errorf("closure %v lacks %s", c.paths, want)
		}
	}
	if err := c.addLibrary("libno-such-library.so.1"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing library: got %v", err)
	}
}

// TestResolveInRoot: symlinks in a sysroot resolve inside it, absolute
// targets included, as in a container of the image; none leads to this
// machine's own files.
func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	mustMkdir(t, root, "usr/lib/x86_64-linux-gnu", "usr/lib64", "etc")
	mustWrite(t, root, "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "loader")
	mustLink(t, root, "lib", "usr/lib")
	mustLink(t, root, "lib64", "usr/lib64")
	mustLink(t, root, "usr/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	mustLink(t, root, "up", "../../../../../../lib")
	// /etc/os-release exists on this machine, and not under root.
	mustLink(t, root, "etc/os-release", "/usr/lib/os-release")
	mustLink(t, root, "loop", "loop")
	loader := filepath.Join(root, "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	tests := []struct {
		path, want string
		notExist   bool
	}{
		{path: "/lib64/ld-linux-x86-64.so.2", want: loader},
		{path: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", want: loader},
		{path: "/up/x86_64-linux-gnu/ld-linux-x86-64.so.2", want: loader},
		{path: "/lib", want: filepath.Join(root, "usr/lib")},
		{path: "/etc/os-release", notExist: true},
		{path: "/lib/x86_64-linux-gnu/libc.so.6", notExist: true},
		{path: "/lib64/ld-linux-x86-64.so.2/x", notExist: true},
		{path: "/loop"},
	}
	for _, tt := range tests {
		got, err := resolveInRoot(root, tt.path)
		switch {
		case tt.notExist:
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: got %q, %v; want an error matching fs.ErrNotExist", tt.path, got, err)
			}
		case tt.want == "":
			if err == nil || !strings.Contains(err.Error(), "too many levels") {
				t.Errorf("%s: got %q, %v; want a symlink loop error", tt.path, got, err)
			}
		case err != nil || got != tt.want:
			t.Errorf("%s: got %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
}

func mustMkdir(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func mustWrite(t *testing.T, root, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, root, name, target string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
		t.Fatal(err)
	}
}
