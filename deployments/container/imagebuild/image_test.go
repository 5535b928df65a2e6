package imagebuild_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

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
	binary := gpudraBinary(t, "amd64")

	opts := imagebuild.Options{
		Binary:      binary,
		NodeBinary:  nodeBinary(binary),
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
		loader := imageLoader{rootfs: rootfs, arch: "amd64"}
		for _, exe := range append([]string{imagebuild.BinaryPath, imagebuild.NodeBinaryPath}, opts.Executables...) {
			loader.checkLibraries(t, exe)
		}
		for _, bin := range []string{imagebuild.BinaryPath, imagebuild.NodeBinaryPath} {
			out := loader.run(t, bin, args...)
			checkVersionOutput(t, out, "linux/amd64")
		}
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
		checkVersionOutput(t, out, "linux/amd64")
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
		checkVersionOutput(t, out, "linux/amd64")
	})
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
