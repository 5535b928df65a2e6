// Package imagebuild assembles the gpudra container image without a
// container daemon or a base image: the gpudra binary, plus exactly the
// files of a Debian root that it and what it runs need (the dynamic loader
// and shared libraries, found through their ELF dynamic sections, and
// nsenter), plus a minimal /etc. The root is the build machine's own for
// its architecture, or a sysroot unpacked from Debian's packages of
// another (deployments/container/debian-sysroot), so that one machine
// builds the images of several platforms. The configuration (entrypoint,
// user, environment, labels) is the Dockerfile's
// (deployments/container/Dockerfile); a test keeps the two in step.
//
// The result is written as an OCI image layout (a directory, for skopeo,
// crane, `ctr image import` via an archive, or this package's tests),
// holding one image or a multi-platform index ([Index]), and as a `docker
// save`-style archive of one image (for `docker load`, `kind load
// image-archive`, `ctr -n k8s.io image import`).
package imagebuild

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's configuration; the Dockerfile's final stage says the same.
const (
	// BinaryPath is where gpudra lies in the image.
	BinaryPath = "/usr/bin/gpudra"
	// NodeBinaryPath is where gpudra-node lies: the node's subcommands
	// alone, which the chart's DaemonSets run (cmd/gpudra-node).
	NodeBinaryPath = "/usr/bin/gpudra-node"
	// User is the default user: distroless's "nonroot". The kubelet
	// plugin's DaemonSet overrides it with runAsUser: 0.
	User = "65532:65532"
	// PathEnv is Debian's default PATH, which debian:bookworm-slim sets.
	PathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Labels returns the image's org.opencontainers.image.* labels.
func Labels(version, commit string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "gpudra",
		"org.opencontainers.image.description": "Kubernetes DRA driver for NVIDIA GPUs",
		"org.opencontainers.image.source":      "https://github.com/gpudra/gpudra",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    commit,
	}
}

// DefaultExecutables are host programs the image carries beside gpudra,
// at the same paths: nsenter, through which `--mps-launcher=systemd-run`
// reaches the host's systemd.
var DefaultExecutables = []string{"/usr/bin/nsenter"}

// DefaultLibraries are glibc's libraries that gpudra does not link but that
// NVML (dlopened from the host's driver root), nvidia-smi and
// nvidia-cuda-mps-control need from the image.
var DefaultLibraries = []string{"libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// Options say what goes into the image.
type Options struct {
	// Binary is the gpudra binary on this machine. Its ELF header says
	// the image's architecture.
	Binary string
	// NodeBinary is the gpudra-node binary of the same architecture.
	NodeBinary string
	// Root is the root of the filesystem the loader, libraries and
	// Executables are taken from, for Binary's architecture: "/" (when
	// empty) for this machine's own, or a sysroot for another. Symlinks
	// in it are followed as in a container of the image: an absolute
	// target is under Root.
	Root string
	// Executables are programs (image paths, read under Root) to copy
	// with their libraries.
	Executables []string
	// Libraries are sonames to copy with their dependencies.
	Libraries []string
	// Version and Commit fill the version and revision labels; they
	// should be what Binary was stamped with.
	Version, Commit string
	// Created is the image's creation time and every file's mtime: the
	// commit's time makes the image reproducible.
	Created time.Time
}

// Build assembles the image: a base layer (loader, libraries, executables,
// /etc, /tmp) and a layer with gpudra and gpudra-node, which is all that changes
// from one commit to the next.
func Build(opts Options) (v1.Image, error) {
	root := opts.Root
	if root == "" {
		root = "/"
	}
	deps := newClosure(root)
	if err := deps.addExecutable(opts.Binary); err != nil {
		return nil, err
	}
	if opts.NodeBinary == "" {
		return nil, fmt.Errorf("no gpudra-node binary beside %s", opts.Binary)
	}
	if err := deps.addExecutable(opts.NodeBinary); err != nil {
		return nil, err
	}
	base := tree{}
	for _, exe := range opts.Executables {
		if err := deps.addImageExecutable(exe); err != nil {
			return nil, err
		}
		if err := base.copyHost(root, exe); err != nil {
			return nil, fmt.Errorf("copy %s: %w", exe, err)
		}
	}
	for _, lib := range opts.Libraries {
		if err := deps.addLibrary(lib); err != nil {
			return nil, fmt.Errorf("library %s: %w", lib, err)
		}
	}
	for _, p := range deps.paths {
		if err := base.copyHost(root, p); err != nil {
			return nil, fmt.Errorf("copy %s: %w", p, err)
		}
	}
	// Where the files came from, for whoever inspects the image; not
	// every build machine has one.
	if _, err := resolveInRoot(root, "/etc/os-release"); err == nil {
		if err := base.copyHost(root, "/etc/os-release"); err != nil {
			return nil, fmt.Errorf("copy /etc/os-release: %w", err)
		}
	}
	if err := addSystemFiles(base); err != nil {
		return nil, err
	}
	if err := base.dir(path.Dir(BinaryPath), 0o755, 0, 0); err != nil {
		return nil, err
	}
	arch, ok := goarch[deps.machine]
	if !ok {
		return nil, fmt.Errorf("%s: unsupported machine %v", opts.Binary, deps.machine)
	}

	bin := tree{}
	for _, b := range []struct{ image, host string }{{BinaryPath, opts.Binary}, {NodeBinaryPath, opts.NodeBinary}} {
		fi, err := os.Stat(b.host)
		if err != nil {
			return nil, err
		}
		bin.hostFile(b.image, b.host, fi.Mode())
	}
	// The directories above gpudra are the base layer's.
	for dir := path.Dir(BinaryPath); dir != "/"; dir = path.Dir(dir) {
		delete(bin, dir)
	}

	// The history names no path of this machine, so that where the
	// sysroot lies does not change the digest.
	from := root
	if root != "/" {
		from = "the " + arch + " sysroot"
	}
	return assemble([]layerFiles{
		{base, "gpudra build-image: loader, libraries and nsenter from " + from + ", /etc, /tmp"},
		{bin, "gpudra build-image: gpudra and gpudra-node " + opts.Version},
	}, opts.Created, arch, v1.Config{
		Entrypoint: []string{BinaryPath},
		Env:        []string{PathEnv},
		User:       User,
		Labels:     Labels(opts.Version, opts.Commit),
	})
}

// layerFiles is one layer of an image: its files, and what made it (the
// layer's history entry).
type layerFiles struct {
	files     tree
	createdBy string
}

// assemble builds an OCI image of layers, created at created, for arch,
// with config.
func assemble(layers []layerFiles, created time.Time, arch string, config v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, layer := range layers {
		l, err := layerOf(layer.files, created)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     l,
			MediaType: types.OCILayer,
			History: v1.History{
				Created:   v1.Time{Time: created},
				CreatedBy: layer.createdBy,
			},
		})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Created = v1.Time{Time: created}
	cf.Config = config
	return mutate.ConfigFile(img, cf)
}

func layerOf(files tree, created time.Time) (v1.Layer, error) {
	b, err := files.tar(created)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// addSystemFiles adds what a program expects of a Linux root besides
// libraries: users (root, and distroless's nonroot, the default user) and
// groups, name service order, and a /tmp.
func addSystemFiles(t tree) error {
	t.file("/etc/passwd", []byte("root:x:0:0:root:/root:/sbin/nologin\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"+
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), 0o644)
	t.file("/etc/group", []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"), 0o644)
	t.file("/etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files dns\n"), 0o644)
	for _, d := range []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{"/tmp", 0o777 | os.ModeSticky, 0, 0},
		{"/root", 0o700, 0, 0},
		{"/home/nonroot", 0o700, 65532, 65532},
	} {
		if err := t.dir(d.path, d.mode, d.uid, d.gid); err != nil {
			return err
		}
	}
	return nil
}
