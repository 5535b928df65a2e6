// Command build-image assembles the gpudra container image without a
// container daemon: `make image` runs it. See deployments/container/README.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "build-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("build-image", flag.ContinueOnError)
	var binaries []string
	fs.Func("binary", "a gpudra binary to put in the image (required; repeat it, one binary per architecture, for a multi-platform image): its ELF header says its architecture", func(s string) error {
		binaries = append(binaries, s)
		return nil
	})
	var nodeBinaries []string
	fs.Func("node-binary", "the gpudra-node binary of each --binary's architecture (required, one per --binary)", func(s string) error {
		nodeBinaries = append(nodeBinaries, s)
		return nil
	})
	sysroots := map[string]string{}
	fs.Func("sysroot", "`ARCH=DIR`: take ARCH's loader, libraries and nsenter from the Debian root DIR (deployments/container/debian-sysroot sets one up) rather than from / (repeatable; / is right only for this machine's architecture, "+runtime.GOARCH+")", func(s string) error {
		arch, dir, ok := strings.Cut(s, "=")
		if !ok || arch == "" || dir == "" {
			return fmt.Errorf("want ARCH=DIR, as in arm64=_output/sysroot/arm64")
		}
		sysroots[arch] = dir
		return nil
	})
	layoutDir := fs.String("layout", "", "write an OCI image layout to this directory (replaced): the image, or with several binaries an image index of them")
	archive := fs.String("archive", "", "write a docker-save archive of one platform's image to this file, for docker load, kind load image-archive or ctr image import")
	archiveArch := fs.String("archive-arch", runtime.GOARCH, "the architecture whose image --archive holds, when there are several: a docker archive holds no index")
	ref := fs.String("tag", "ghcr.io/gpudra/gpudra:devel", "the image's name and tag")
	version := fs.String("version", "devel", "the release version gpudra was stamped with (label org.opencontainers.image.version)")
	commit := fs.String("commit", "unknown", "the git commit gpudra was built from (label org.opencontainers.image.revision)")
	created := fs.String("created", "0", "creation time and every file's mtime: RFC 3339 or Unix seconds (the commit's time makes the image reproducible)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(binaries) == 0 || (*layoutDir == "" && *archive == "") {
		return fmt.Errorf("--binary and one of --layout or --archive are required")
	}
	createdAt, err := parseTime(*created)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}

	nodeBinary := map[string]string{}
	for _, b := range nodeBinaries {
		arch, err := imagebuild.BinaryArch(b)
		if err != nil {
			return err
		}
		if nodeBinary[arch] != "" {
			return fmt.Errorf("--node-binary: two %s binaries, %s and %s", arch, nodeBinary[arch], b)
		}
		nodeBinary[arch] = b
	}

	var images []v1.Image
	used := map[string]bool{}
	for _, binary := range binaries {
		arch, err := imagebuild.BinaryArch(binary)
		if err != nil {
			return err
		}
		root, ok := sysroots[arch]
		if !ok && arch != runtime.GOARCH {
			return fmt.Errorf("%s is an %s binary and this machine is %s: name the %s root its libraries come from with --sysroot %s=DIR (deployments/container/debian-sysroot %s DIR sets one up)",
				binary, arch, runtime.GOARCH, arch, arch, arch)
		}
		if nodeBinary[arch] == "" {
			return fmt.Errorf("%s is an %s binary and no --node-binary is %s", binary, arch, arch)
		}
		used[arch] = true
		img, err := imagebuild.Build(imagebuild.Options{
			Binary:      binary,
			NodeBinary:  nodeBinary[arch],
			Root:        root,
			Executables: imagebuild.DefaultExecutables,
			Libraries:   imagebuild.DefaultLibraries,
			Version:     *version,
			Commit:      *commit,
			Created:     createdAt,
		})
		if err != nil {
			return fmt.Errorf("%s image: %w", arch, err)
		}
		images = append(images, img)
	}
	for arch, b := range nodeBinary {
		if !used[arch] {
			return fmt.Errorf("--node-binary %s: no --binary is %s", b, arch)
		}
	}
	for arch := range sysroots {
		if !used[arch] {
			return fmt.Errorf("--sysroot %s: no --binary is %s", arch, arch)
		}
	}

	if *layoutDir != "" {
		if len(images) == 1 {
			err = imagebuild.WriteLayout(*layoutDir, images[0], *ref)
		} else {
			var idx v1.ImageIndex
			if idx, err = imagebuild.Index(images...); err == nil {
				err = imagebuild.WriteIndexLayout(*layoutDir, idx, *ref)
				if err == nil {
					err = printIndex(*ref, idx)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	if *archive != "" {
		img, err := pick(images, *archiveArch)
		if err != nil {
			return fmt.Errorf("--archive: %w", err)
		}
		if err := imagebuild.WriteArchive(*archive, img, *ref); err != nil {
			return err
		}
	}
	for _, img := range images {
		if err := printImage(*ref, img); err != nil {
			return err
		}
	}
	return nil
}

// pick is the image of arch; the only image when there is one.
func pick(images []v1.Image, arch string) (v1.Image, error) {
	if len(images) == 1 {
		return images[0], nil
	}
	for _, img := range images {
		p, err := imagebuild.PlatformOf(img)
		if err != nil {
			return nil, err
		}
		if p.Architecture == arch {
			return img, nil
		}
	}
	return nil, fmt.Errorf("no %s image among the binaries", arch)
}

func printIndex(ref string, idx v1.ImageIndex) error {
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s (image index)\n", ref, digest)
	return nil
}

func printImage(ref string, img v1.Image) error {
	p, err := imagebuild.PlatformOf(img)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := imagebuild.CompressedSize(img)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s, %.1f MiB compressed\n", ref, p, digest, float64(size)/(1<<20))
	return nil
}

func parseTime(s string) (time.Time, error) {
	if secs, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(secs, 0).UTC(), nil
	}
	return time.Parse(time.RFC3339, s)
}
