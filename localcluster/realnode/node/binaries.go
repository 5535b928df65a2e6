package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/kubelet"
)

// Binaries are the programs of a real node, built into a cache directory
// outside the repository.
type Binaries struct {
	// Kubelet is the kubelet of the local cluster's Kubernetes version.
	Kubelet string
	// Runtime are containerd, its shim, ctr, the CNI plugins and runc.
	Runtime containerruntime.Binaries
	// FakeMPS is the simulated GPUs' nvidia-cuda-mps-control (package
	// realnode/fakemps), a static program.
	FakeMPS string
}

// BuildBinaries builds what is missing of the kubelet (package kubelet)
// and the runtime's programs (package containerruntime) into
// kubelet.DefaultCacheDir, and returns them. A cold build takes minutes; a
// cached one nothing.
func BuildBinaries(ctx context.Context) (Binaries, error) {
	version, err := controlplane.KubernetesVersion()
	if err != nil {
		return Binaries{}, err
	}
	cache, err := kubelet.DefaultCacheDir()
	if err != nil {
		return Binaries{}, err
	}
	k, err := kubelet.Build(ctx, cache, version, nil)
	if err != nil {
		return Binaries{}, err
	}
	rt, err := containerruntime.BuildBinaries(ctx, cache)
	if err != nil {
		return Binaries{}, err
	}
	root, err := repositoryRoot()
	if err != nil {
		return Binaries{}, err
	}
	// Built every time (seconds when cached by Go): it follows the
	// checkout's pkg/mps/mpsfake.
	fakeMPS := filepath.Join(cache, "fake-mps")
	build := exec.CommandContext(ctx, "go", "build", "-o", fakeMPS, "./realnode/fakemps")
	build.Dir = filepath.Join(root, "localcluster")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("build the real node's fake MPS control: %w\n%s", err, out)
	}
	return Binaries{Kubelet: k, Runtime: rt, FakeMPS: fakeMPS}, nil
}

// ImageRepository and ImageTag are gpudra's image as a real node has it
// (the chart's image.repository, with a tag of the local cluster's own):
// built from this checkout by [WriteGPUDRAImage], imported, never pulled.
const (
	ImageRepository = "ghcr.io/gpudra/gpudra"
	ImageTag        = "gpudra-sim"
)

// WriteGPUDRAImage builds gpudra from this checkout and its image as `make
// image` does (deployments/container/imagebuild, this machine's Debian
// libraries), and writes it as an archive in dir, named
// ImageRepository:ImageTag. It returns the archive's path. The go build is
// incremental: seconds when the code has not changed.
func WriteGPUDRAImage(ctx context.Context, dir string) (string, error) {
	root, err := repositoryRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "gpudra")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/gpudra")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build gpudra for its image: %w\n%s", err, out)
	}
	img, err := imagebuild.Build(imagebuild.Options{
		Binary:      bin,
		Executables: imagebuild.DefaultExecutables,
		Libraries:   imagebuild.DefaultLibraries,
		Version:     "devel",
		Commit:      "gpudra-sim",
		Created:     time.Unix(0, 0).UTC(),
	})
	if err != nil {
		return "", fmt.Errorf("gpudra's image: %w", err)
	}
	archive := filepath.Join(dir, "gpudra-image.tar")
	if err := imagebuild.WriteArchive(archive, img, ImageRepository+":"+ImageTag); err != nil {
		return "", fmt.Errorf("gpudra's image: %w", err)
	}
	return archive, nil
}

// repositoryRoot finds the driver module from this source file: the local
// cluster runs from the repository.
func repositoryRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("gpudra's image: cannot locate the repository")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, "cmd", "gpudra")); err != nil {
		return "", fmt.Errorf("gpudra's image: the repository's cmd/gpudra: %w", err)
	}
	return root, nil
}
