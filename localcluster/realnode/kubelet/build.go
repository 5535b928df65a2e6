// Package kubelet runs the real kubelet, built from k8s.io/kubernetes at
// the local cluster's version, as one node of the local cluster: its own
// root directory (plugins/, plugins_registry/, pods/), pod logs directory
// and serving certificate, against the local cluster's API server and a
// container runtime's CRI endpoint (package realnode/runtime). It is the
// kubelet half of a real node; the runtime half, images and device nodes
// are the runtime package's.
package kubelet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// BuildModuleDir is the module that builds the kubelet, relative to the
// repository's root. The kubelet needs modules the local cluster's own
// module does not require (cadvisor's containerd client, the CSI spec,
// cri-streaming, ...); a small module of its own keeps them out of the
// local cluster's go.mod. Its requirements are pinned to the versions the
// local cluster selects, so that a build reuses the packages already in
// Go's build cache.
const BuildModuleDir = "localcluster/realnode/kubeletbin"

// Package is the kubelet's main package.
const Package = "k8s.io/kubernetes/cmd/kubelet"

// DefaultCacheDir is where Build puts the kubelet unless told otherwise:
// $GPUDRA_REAL_NODE_BIN, else gpudra/realnode under the user's cache
// directory (~/.cache), beside the runtime's programs (package
// containerruntime). Never a path in the repository.
func DefaultCacheDir() (string, error) {
	if dir := os.Getenv("GPUDRA_REAL_NODE_BIN"); dir != "" {
		return dir, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache directory for the real node's binaries: %w", err)
	}
	return filepath.Join(dir, "gpudra", "realnode"), nil
}

// BinaryPath returns where Build puts the kubelet of the given Kubernetes
// version ("v1.37.1") in cacheDir.
func BinaryPath(cacheDir, version string) string {
	return filepath.Join(cacheDir, "kubelet-"+version)
}

// Built reports whether Build finds the kubelet of version in cacheDir,
// and takes no time.
func Built(cacheDir, version string) bool {
	fi, err := os.Stat(BinaryPath(cacheDir, version))
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Build returns the kubelet of the given Kubernetes version ("v1.37.1",
// the module version of k8s.io/kubernetes in BuildModuleDir) in cacheDir,
// building it with `go build` when it is not there yet. The build stamps
// the version into k8s.io/component-base/version, as Kubernetes' release
// builds do: the Node then reports it as its kubeletVersion rather than
// v0.0.0-master. A cold build takes minutes (with Go's build cache warm
// from the local cluster, about two on 2 cores); output, when set, gets
// the go command's output.
func Build(ctx context.Context, cacheDir, version string, output *bytes.Buffer) (string, error) {
	bin := BinaryPath(cacheDir, version)
	if Built(cacheDir, version) {
		return bin, nil
	}
	major, minor, ok := majorMinor(version)
	if !ok {
		return "", fmt.Errorf("build the kubelet: version %q: want v<major>.<minor>.<patch>", version)
	}
	moduleDir, err := buildModuleDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("build the kubelet: %w", err)
	}
	const pkg = "k8s.io/component-base/version"
	ldflags := strings.Join([]string{
		"-X " + pkg + ".gitVersion=" + version,
		"-X " + pkg + ".gitMajor=" + major,
		"-X " + pkg + ".gitMinor=" + minor,
		"-X " + pkg + ".gitTreeState=clean",
	}, " ")
	// Written beside the binary and renamed: an interrupted build leaves
	// no half-written kubelet that a later run would take.
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", ldflags, "-o", tmp, Package)
	cmd.Dir = moduleDir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if output != nil {
		cmd.Stdout, cmd.Stderr = output, output
	}
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("build the kubelet (go build %s in %s): %w\n%s", Package, BuildModuleDir, err, out.String())
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("build the kubelet: %w", err)
	}
	return bin, nil
}

// majorMinor splits "v1.37.1" into "1" and "37".
func majorMinor(version string) (string, string, bool) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) != 3 || !strings.HasPrefix(version, "v") || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// buildModuleDir finds BuildModuleDir from this source file: the local
// cluster runs from the repository.
func buildModuleDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("build the kubelet: cannot locate the repository")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "kubeletbin")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("build the kubelet: the module %s: %w", BuildModuleDir, err)
	}
	return dir, nil
}
