package containerruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"k8s.io/klog/v2"
)

// BuildTags are the build tags of containerd: the snapshotters that need C
// libraries or kernel features this project does not use are left out.
const BuildTags = "no_btrfs,no_devmapper,no_zfs"

// Packages are the programs built from the module in
// localcluster/realnode/containerd (its go.mod names their versions as
// tools): containerd, its runc shim, ctr (which imports images), and the
// CNI plugins of the pod network.
var Packages = []string{
	"github.com/containerd/containerd/v2/cmd/containerd",
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
	"github.com/containerd/containerd/v2/cmd/ctr",
	"github.com/containernetworking/plugins/plugins/main/bridge",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
	"github.com/containernetworking/plugins/plugins/main/loopback",
	"github.com/containernetworking/plugins/plugins/meta/portmap",
}

// Binaries are the programs a real node's container runtime runs. Every
// one lies in Dir, which is also the CNI plugin directory and is put first
// on containerd's PATH (where it finds containerd-shim-runc-v2).
type Binaries struct {
	// Dir holds containerd, containerd-shim-runc-v2, ctr, the CNI
	// plugins (bridge, host-local, loopback, portmap) and pause.
	Dir string
	// Runc is the OCI runtime: Debian's runc.
	Runc string
}

func (b Binaries) path(name string) string { return filepath.Join(b.Dir, name) }

// names of the files BuildBinaries writes, as go build names them.
var binaryNames = []string{"containerd", "containerd-shim-runc-v2", "ctr", "bridge", "host-local", "loopback", "portmap", "pause"}

// DefaultBinariesDir is where BuildBinaries keeps its builds when the
// caller names no directory: gpudra/realnode under the user's cache
// directory, outside the repository.
func DefaultBinariesDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("real node binaries: %w", err)
	}
	return filepath.Join(dir, "gpudra", "realnode"), nil
}

// BuildBinaries builds containerd, its shim, ctr, the CNI plugins and the
// pause program into a subdirectory of dir named after the sources they
// come from (containerd's go.mod and go.sum, pause's source), and reuses
// that subdirectory when it already holds all of them: a cold build takes
// minutes, a reuse nothing. runc is looked up on PATH.
func BuildBinaries(ctx context.Context, dir string) (Binaries, error) {
	logger := klog.FromContext(ctx)
	runc, err := exec.LookPath("runc")
	if err != nil {
		return Binaries{}, fmt.Errorf("real node: runc not found (Debian: apt-get install runc): %w", err)
	}
	src, err := sourceDir()
	if err != nil {
		return Binaries{}, err
	}
	key, err := sourceKey(src)
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{Dir: filepath.Join(dir, key), Runc: runc}
	if complete(b) {
		logger.V(2).Info("Reusing real node binaries", "dir", b.Dir)
		return b, nil
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return Binaries{}, fmt.Errorf("real node: building containerd needs the go command: %w", err)
	}
	// Built into a temporary directory renamed at the end, so that an
	// interrupted build never leaves a directory that looks complete.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("real node binaries: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, key+".building-")
	if err != nil {
		return Binaries{}, fmt.Errorf("real node binaries: %w", err)
	}
	defer os.RemoveAll(tmp)
	logger.Info("Building containerd, runc shim, ctr and CNI plugins (minutes when cold)", "dir", b.Dir)
	build := exec.CommandContext(ctx, goTool, append([]string{"build", "-tags", BuildTags, "-o", tmp + "/"}, Packages...)...)
	build.Dir = filepath.Join(src, "containerd")
	if out, err := build.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("real node: build containerd in %s: %w\n%s", build.Dir, err, out)
	}
	pause := exec.CommandContext(ctx, goTool, "build", "-o", filepath.Join(tmp, "pause"), "./realnode/pause")
	pause.Dir = filepath.Dir(src)
	pause.Env = append(os.Environ(), "CGO_ENABLED=0") // static: the image has no libc
	if out, err := pause.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("real node: build pause: %w\n%s", err, out)
	}
	if err := os.Rename(tmp, b.Dir); err != nil && !complete(b) {
		return Binaries{}, fmt.Errorf("real node binaries: %w", err)
	}
	return b, nil
}

// BinariesBuilt reports whether BuildBinaries(ctx, dir) would find its
// programs built already, and take no time.
func BinariesBuilt(dir string) bool {
	src, err := sourceDir()
	if err != nil {
		return false
	}
	key, err := sourceKey(src)
	if err != nil {
		return false
	}
	return complete(Binaries{Dir: filepath.Join(dir, key)})
}

func complete(b Binaries) bool {
	for _, name := range binaryNames {
		if _, err := os.Stat(b.path(name)); err != nil {
			return false
		}
	}
	return true
}

// sourceDir is localcluster/realnode in this checkout: the programs are
// built from source, so the source must be at hand (as for the local
// cluster's other builds, a -trimpath build cannot find it).
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("real node: cannot locate the source of localcluster/realnode")
	}
	dir := filepath.Dir(filepath.Dir(file))
	if _, err := os.Stat(filepath.Join(dir, "containerd", "go.mod")); err != nil {
		return "", fmt.Errorf("real node: containerd's module not found beside %s (built with -trimpath?): %w", file, err)
	}
	return dir, nil
}

// sourceKey hashes what the binaries are built from.
func sourceKey(src string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"containerd/go.mod", "containerd/go.sum", "pause/main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("real node binaries: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	fmt.Fprintf(h, "tags %s go %s\n", BuildTags, runtime.Version())
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
