package imagebuild_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

const (
	testVersion = "v1.2.3-test"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
	versionPkg  = "github.com/gpudra/gpudra/pkg/version"
)

// TestImageRunsGpudraVersion builds gpudra, assembles the image, writes it
// as an OCI layout, reads it back, unpacks its rootfs and runs `gpudra
// version` in it: with the image's own loader and nothing of the host's
// libraries (always), chrooted as the image's user (as root), and with
// runc (where runc is installed and can run a container here).
func TestImageRunsGpudraVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gpudra")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the loader checks name x86-64 paths")
	}
	dir := t.TempDir()
	binary := buildGpudra(t, dir)

	opts := imagebuild.Options{
		Binary:      binary,
		Executables: imagebuild.DefaultExecutables,
		Libraries:   imagebuild.DefaultLibraries,
		Version:     testVersion,
		Commit:      testCommit,
		Created:     time.Unix(1700000000, 0).UTC(),
	}
	for _, exe := range opts.Executables {
		if _, err := os.Stat(exe); err != nil {
			t.Skipf("this machine lacks %s, which the image carries (Debian: util-linux): %v", exe, err)
		}
	}
	img, err := imagebuild.Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := imagebuild.Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := digest(t, img), digest(t, again); d1 != d2 {
		t.Errorf("two builds from the same input differ: %s, %s", d1, d2)
	}

	layoutDir := filepath.Join(dir, "layout")
	if err := imagebuild.WriteLayout(layoutDir, img, "ghcr.io/gpudra/gpudra:"+testVersion); err != nil {
		t.Fatal(err)
	}
	img = readLayout(t, layoutDir)
	if d1, d2 := digest(t, img), digest(t, again); d1 != d2 {
		t.Errorf("the layout holds %s, the build was %s", d1, d2)
	}
	if err := imagebuild.WriteArchive(filepath.Join(dir, "image.tar"), img, "ghcr.io/gpudra/gpudra:"+testVersion); err != nil {
		t.Fatal(err)
	}
	size, err := imagebuild.CompressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: %.1f MiB compressed", digest(t, img), float64(size)/(1<<20))

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	checkConfigMatchesDockerfile(t, cf.Config)

	rootfs := filepath.Join(dir, "bundle", "rootfs")
	unpack(t, img, rootfs)
	for _, soname := range opts.Libraries {
		if _, err := resolveIn(rootfs, "/lib/x86_64-linux-gnu/"+soname); err != nil {
			t.Errorf("image lacks %s, which NVML needs: %v", soname, err)
		}
	}
	args := []string{"version", "-o", "json"}

	t.Run("image loader and libraries only", func(t *testing.T) {
		for _, exe := range append([]string{imagebuild.BinaryPath}, opts.Executables...) {
			checkLibrariesFromImage(t, rootfs, exe)
		}
		out := runWithImageLoader(t, rootfs, imagebuild.BinaryPath, args...)
		checkVersionOutput(t, out)
	})

	t.Run("chroot", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chroot needs root; the loader check above proves the libraries")
		}
		cmd := exec.Command(imagebuild.BinaryPath, args...)
		cmd.Dir = "/"
		cmd.Env = []string{imagebuild.PathEnv}
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chroot %s %s: %v\n%s", rootfs, imagebuild.BinaryPath, err, stderrOf(err))
		}
		checkVersionOutput(t, out)
	})

	t.Run("runc", func(t *testing.T) {
		runc, err := exec.LookPath("runc")
		if err != nil {
			t.Skip("runc is not installed (Debian: apt-get install runc); the loader and chroot checks ran")
		}
		if msg := runcUnusable(t, runc, dir); msg != "" {
			t.Skip("runc cannot run a container on this machine, so the image was not run with it: " + msg)
		}
		out, err := runcRun(t, runc, filepath.Join(dir, "bundle"), cf.Config.Entrypoint, args, cf.Config.User)
		if err != nil {
			t.Fatalf("runc run gpudra version: %v\n%s", err, out)
		}
		checkVersionOutput(t, out)
	})
}

// buildGpudra builds cmd/gpudra of the driver module, stamped like a
// release. GPUDRA_BINARY names a binary built already instead.
func buildGpudra(t *testing.T, dir string) string {
	if bin := os.Getenv("GPUDRA_BINARY"); bin != "" {
		t.Logf("using GPUDRA_BINARY=%s; its version must be %s", bin, testVersion)
		return bin
	}
	bin := filepath.Join(dir, "gpudra")
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X "+versionPkg+".version="+testVersion+" -X "+versionPkg+".commit="+testCommit,
		"./cmd/gpudra")
	cmd.Dir = "../../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build gpudra: %v\n%s", err, out)
	}
	t.Logf("built gpudra in %v", time.Since(start).Round(time.Second))
	return bin
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func readLayout(t *testing.T, dir string) v1.Image {
	t.Helper()
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("layout has %d manifests, want 1", len(m.Manifests))
	}
	if got := m.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != testVersion {
		t.Errorf("ref.name annotation %q, want %q", got, testVersion)
	}
	img, err := index.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

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

func imageLoader(t *testing.T, rootfs string) (loader, libraryPath string) {
	t.Helper()
	loader, err := resolveIn(rootfs, "/lib64/ld-linux-x86-64.so.2")
	if err != nil {
		t.Fatalf("the image's dynamic loader: %v", err)
	}
	var dirs []string
	for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"} {
		if r, err := resolveIn(rootfs, d); err == nil {
			dirs = append(dirs, r)
		}
	}
	return loader, strings.Join(dirs, ":")
}

// checkLibrariesFromImage lists, with the image's loader, where each
// library of exe comes from, and fails for one that does not come from the
// image: the loader falls back to the host's system directories for a
// library the image lacks.
func checkLibrariesFromImage(t *testing.T, rootfs, exe string) {
	t.Helper()
	loader, libraryPath := imageLoader(t, rootfs)
	bin, err := resolveIn(rootfs, exe)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(loader, "--inhibit-cache", "--library-path", libraryPath, "--list", bin).Output()
	if err != nil {
		t.Fatalf("%s --list %s: %v\n%s", loader, exe, err, stderrOf(err))
	}
	arrow := regexp.MustCompile(`^\s*(\S+) => (\S+)`)
	libs := 0
	for _, line := range strings.Split(string(out), "\n") {
		m := arrow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		libs++
		if !strings.HasPrefix(m[2], rootfs+"/") {
			t.Errorf("%s: %s comes from %s, not from the image", exe, m[1], m[2])
		}
	}
	if libs == 0 {
		t.Errorf("%s: the loader lists no libraries:\n%s", exe, out)
	}
}

func runWithImageLoader(t *testing.T, rootfs, exe string, args ...string) []byte {
	t.Helper()
	loader, libraryPath := imageLoader(t, rootfs)
	bin, err := resolveIn(rootfs, exe)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(loader, append([]string{"--inhibit-cache", "--library-path", libraryPath, bin}, args...)...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", loader, exe, err, stderrOf(err))
	}
	return out
}

func checkVersionOutput(t *testing.T, out []byte) {
	t.Helper()
	var got struct{ Version, Commit, GoVersion, Platform string }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("gpudra version -o json: %v\n%s", err, out)
	}
	if got.Version != testVersion || got.Commit != testCommit {
		t.Errorf("gpudra version says %s %s, want %s %s", got.Version, got.Commit, testVersion, testCommit)
	}
}

// runcUnusable runs a static probe with runc in a rootfs of its own, and
// says why runc cannot run containers here, or "" when it can.
func runcUnusable(t *testing.T, runc, dir string) string {
	t.Helper()
	bundle := filepath.Join(dir, "probe-bundle")
	probe := filepath.Join(bundle, "rootfs", "probe")
	build := exec.Command("go", "build", "-o", probe, "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	out, err := runcRun(t, runc, bundle, []string{"/probe"}, nil, "0:0")
	if err != nil {
		return fmt.Sprintf("a static probe failed too: %v: %s", err, bytes.TrimSpace(out))
	}
	if !bytes.Contains(out, []byte("probe ok")) {
		return fmt.Sprintf("a static probe printed %q", out)
	}
	return ""
}

// runcRun runs one container from bundle's rootfs with runc's default
// spec (namespaces, read-only root, no network), the given process and
// user, and returns its output.
func runcRun(t *testing.T, runc, bundle string, entrypoint, args []string, user string) ([]byte, error) {
	t.Helper()
	stateRoot := filepath.Join(filepath.Dir(bundle), "runc-state")
	if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return out, fmt.Errorf("runc spec: %w", err)
	}
	specPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	var uid, gid int
	if _, err := fmt.Sscanf(user, "%d:%d", &uid, &gid); err != nil {
		t.Fatalf("user %q: %v", user, err)
	}
	process := spec["process"].(map[string]any)
	process["args"] = append(append([]string{}, entrypoint...), args...)
	process["terminal"] = false
	process["env"] = []string{imagebuild.PathEnv}
	process["user"] = map[string]any{"uid": uid, "gid": gid}
	if raw, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("gpudra-imagebuild-%d-%s", os.Getpid(), filepath.Base(bundle))
	t.Cleanup(func() { _ = exec.Command(runc, "--root", stateRoot, "delete", "--force", id).Run() })
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(runc, "--root", stateRoot, "run", "--bundle", bundle, id)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return append(stdout.Bytes(), stderr.Bytes()...), err
		}
		return stdout.Bytes(), nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done //nolint:errcheck // the kill is the error reported
		return append(stdout.Bytes(), stderr.Bytes()...), errors.New("runc run: no exit after 30s")
	}
}

func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
