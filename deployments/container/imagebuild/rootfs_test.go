package imagebuild_test

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// unpack writes the image's flattened filesystem to dir.
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean("/" + hdr.Name)
		target := filepath.Join(dir, name)
		// Extract goes from the top layer down: gpudra comes before
		// the base layer's /usr/bin.
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
			if err == nil {
				err = os.Chmod(target, os.FileMode(hdr.Mode).Perm()|sticky(hdr.Mode))
			}
			if err == nil {
				err = os.Lchown(target, hdr.Uid, hdr.Gid)
			}
		case tar.TypeSymlink:
			err = os.Symlink(hdr.Linkname, target)
		case tar.TypeReg:
			var f *os.File
			f, err = os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode).Perm())
			if err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		default:
			err = fmt.Errorf("unexpected type %c", hdr.Typeflag)
		}
		if err != nil && !(errors.Is(err, os.ErrPermission) && hdr.Typeflag == tar.TypeDir) {
			t.Fatalf("unpack %s: %v", name, err)
		}
	}
}

func sticky(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

// resolveIn resolves p inside rootfs as the kernel would after a chroot:
// absolute symlink targets are rootfs-relative.
func resolveIn(rootfs, p string) (string, error) {
	cur := "/"
	parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	for hops := 0; len(parts) > 0; {
		next := path.Join(cur, parts[0])
		parts = parts[1:]
		fi, err := os.Lstat(filepath.Join(rootfs, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many symlinks", p)
		}
		target, err := os.Readlink(filepath.Join(rootfs, next))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		parts = append(strings.Split(strings.TrimPrefix(path.Clean(target), "/"), "/"), parts...)
		cur = "/"
	}
	return filepath.Join(rootfs, cur), nil
}

// debianLoaders are where Debian's dynamic loader and system library
// directories lie, by GOARCH.
var debianLoaders = map[string]struct {
	loader  string
	libDirs []string
}{
	"amd64": {"/lib64/ld-linux-x86-64.so.2", []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}},
	"arm64": {"/lib/ld-linux-aarch64.so.1", []string{"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"}},
}

// imageLoader runs programs of an image unpacked at rootfs with the
// image's own loader and library directories and nothing of this
// machine's, under emulator (qemu-user) when the image is of another
// architecture.
type imageLoader struct {
	rootfs   string
	arch     string
	emulator []string
}

// command is the loader's command line for exe (an image path), with
// loaderArgs before exe's path and args after it.
func (l imageLoader) command(t *testing.T, exe string, loaderArgs []string, args ...string) *exec.Cmd {
	t.Helper()
	paths, ok := debianLoaders[l.arch]
	if !ok {
		t.Fatalf("no loader paths for %s", l.arch)
	}
	loader, err := resolveIn(l.rootfs, paths.loader)
	if err != nil {
		t.Fatalf("the image's dynamic loader: %v", err)
	}
	var dirs []string
	for _, d := range paths.libDirs {
		if r, err := resolveIn(l.rootfs, d); err == nil {
			dirs = append(dirs, r)
		}
	}
	bin, err := resolveIn(l.rootfs, exe)
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append([]string{}, l.emulator...), loader, "--inhibit-cache", "--library-path", strings.Join(dirs, ":"))
	argv = append(append(append(argv, loaderArgs...), bin), args...)
	return exec.Command(argv[0], argv[1:]...)
}

// checkLibraries lists, with the image's loader, where each library of
// exe comes from, and fails for one that does not come from the image:
// the loader falls back to the host's system directories for a library
// the image lacks.
func (l imageLoader) checkLibraries(t *testing.T, exe string) {
	t.Helper()
	cmd := l.command(t, exe, []string{"--list"})
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderrOf(err))
	}
	arrow := regexp.MustCompile(`^\s*(\S+) => (\S+)`)
	libs := 0
	for _, line := range strings.Split(string(out), "\n") {
		m := arrow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		libs++
		if !strings.HasPrefix(m[2], l.rootfs+"/") {
			t.Errorf("%s: %s comes from %s, not from the image", exe, m[1], m[2])
		}
	}
	if libs == 0 {
		t.Errorf("%s: the loader lists no libraries:\n%s", exe, out)
	}
}

// run runs exe with args and returns its standard output.
func (l imageLoader) run(t *testing.T, exe string, args ...string) []byte {
	t.Helper()
	cmd := l.command(t, exe, nil, args...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderrOf(err))
	}
	return out
}

func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
