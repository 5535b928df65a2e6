package imagebuild

import (
	"archive/tar"
	"fmt"
	"os"
	"path"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// SmallOptions say what goes into a small single-layer image of programs
// from this machine, such as the local cluster's pause image (a static Go
// program) and its test image (Debian's static busybox).
type SmallOptions struct {
	// Programs are the image's executables: image path to host path. A
	// dynamically linked program brings its loader and libraries, found
	// as [Build] finds gpudra's.
	Programs map[string]string
	// Links are symbolic links: image path to target (busybox's applet
	// names, for example).
	Links map[string]string
	// Entrypoint, Cmd and Env are the image's configuration; Env gets
	// Debian's default PATH when empty.
	Entrypoint, Cmd, Env []string
	// Created is the image's creation time and every file's mtime.
	Created time.Time
}

// BuildSmall assembles an image of one layer: opts' programs and links,
// the libraries dynamic programs need, and the /etc and /tmp every image of
// this package has. Its user is root.
func BuildSmall(opts SmallOptions) (v1.Image, error) {
	if len(opts.Programs) == 0 {
		return nil, fmt.Errorf("small image: no programs")
	}
	deps := newClosure("/")
	files := tree{}
	for _, imagePath := range sortedKeys(opts.Programs) {
		hostPath := opts.Programs[imagePath]
		if !path.IsAbs(imagePath) {
			return nil, fmt.Errorf("small image: program path %q is not absolute", imagePath)
		}
		fi, err := os.Stat(hostPath)
		if err != nil {
			return nil, fmt.Errorf("small image: program %s: %w", imagePath, err)
		}
		if err := deps.addExecutable(hostPath); err != nil {
			return nil, fmt.Errorf("small image: program %s: %w", imagePath, err)
		}
		files.hostFile(path.Clean(imagePath), hostPath, fi.Mode())
	}
	for _, p := range deps.paths {
		if err := files.copyHost("/", p); err != nil {
			return nil, fmt.Errorf("small image: copy %s: %w", p, err)
		}
	}
	for _, imagePath := range sortedKeys(opts.Links) {
		if !path.IsAbs(imagePath) {
			return nil, fmt.Errorf("small image: link path %q is not absolute", imagePath)
		}
		p := path.Clean(imagePath)
		if _, ok := files[p]; ok {
			return nil, fmt.Errorf("small image: link %s: the path is also a program", p)
		}
		files.parents(p)
		files[p] = &entry{typeflag: tar.TypeSymlink, mode: 0o777, linkname: opts.Links[imagePath]}
	}
	if err := addSystemFiles(files); err != nil {
		return nil, err
	}
	arch, ok := goarch[deps.machine]
	if !ok {
		return nil, fmt.Errorf("small image: unsupported machine %v", deps.machine)
	}
	env := opts.Env
	if len(env) == 0 {
		env = []string{PathEnv}
	}
	return assemble([]layerFiles{{files, "gpudra imagebuild.BuildSmall"}}, opts.Created, arch,
		v1.Config{Entrypoint: opts.Entrypoint, Cmd: opts.Cmd, Env: env})
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
