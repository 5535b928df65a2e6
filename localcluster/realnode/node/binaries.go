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

// BuildOption configures BuildBinaries.
type BuildOption func(*buildOptions)

type buildOptions struct {
	progress func(string)
}

// WithProgress has BuildBinaries say what it builds: a line before each
// build that is not cached (minutes) and one after it with how long it
// took. What is cached gets no line.
func WithProgress(progress func(string)) BuildOption {
	return func(o *buildOptions) { o.progress = progress }
}

// BuildBinaries builds what is missing of the kubelet (package kubelet)
// and the runtime's programs (package containerruntime) into
// kubelet.DefaultCacheDir, and returns them. A cold build takes minutes; a
// cached one nothing.
func BuildBinaries(ctx context.Context, opts ...BuildOption) (Binaries, error) {
	o := buildOptions{progress: func(string) {}}
	for _, opt := range opts {
		opt(&o)
	}
	version, err := controlplane.KubernetesVersion()
	if err != nil {
		return Binaries{}, err
	}
	cache, err := kubelet.DefaultCacheDir()
	if err != nil {
		return Binaries{}, err
	}
	// timed runs a build, saying so where it is not cached.
	timed := func(what string, cached bool, build func() error) error {
		if cached {
			return build()
		}
		start := time.Now()
		o.progress(fmt.Sprintf("building %s into %s (not cached: minutes on 2 cores)", what, cache))
		if err := build(); err != nil {
			return err
		}
		o.progress(fmt.Sprintf("built %s in %v", what, time.Since(start).Round(time.Second)))
		return nil
	}
	var k string
	err = timed("the kubelet "+version, kubelet.Built(cache, version), func() (err error) {
		k, err = kubelet.Build(ctx, cache, version, nil)
		return err
	})
	if err != nil {
		return Binaries{}, err
	}
	var rt containerruntime.Binaries
	err = timed("containerd", containerruntime.BinariesBuilt(cache), func() (err error) {
		rt, err = containerruntime.BuildBinaries(ctx, cache)
		return err
	})
	if err != nil {
		return Binaries{}, err
	}
	root, err := repositoryRoot()
	if err != nil {
		return Binaries{}, err
	}
	// Built every time (seconds when cached by Go): it follows the
	// checkout's internal/mpsfake.
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

// WriteGPUDRAImage builds gpudra and gpudra-node from this checkout and
// their image as `make image` does (deployments/container/imagebuild, this machine's Debian
// libraries), and writes it as an archive in dir, named
// ImageRepository:ImageTag. It returns the archive's path. The go build is
// incremental: seconds when the code has not changed.
func WriteGPUDRAImage(ctx context.Context, dir string) (string, error) {
	root, err := repositoryRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "gpudra")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags", "-s -w", "-o", dir+"/", "./cmd/gpudra", "./cmd/gpudra-node")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build gpudra for its image: %w\n%s", err, out)
	}
	img, err := imagebuild.Build(imagebuild.Options{
		Binary:      bin,
		NodeBinary:  filepath.Join(dir, "gpudra-node"),
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
