// Command build-image assembles the gpudra container image without a
// container daemon: `make image` runs it. See deployments/container/README.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

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
	binary := fs.String("binary", "", "the gpudra binary to put in the image (required)")
	layoutDir := fs.String("layout", "", "write an OCI image layout to this directory (replaced)")
	archive := fs.String("archive", "", "write a docker-save archive to this file, for docker load, kind load image-archive or ctr image import")
	ref := fs.String("tag", "ghcr.io/gpudra/gpudra:devel", "the image's name and tag")
	version := fs.String("version", "devel", "the release version gpudra was stamped with (label org.opencontainers.image.version)")
	commit := fs.String("commit", "unknown", "the git commit gpudra was built from (label org.opencontainers.image.revision)")
	created := fs.String("created", "0", "creation time and every file's mtime: RFC 3339 or Unix seconds (the commit's time makes the image reproducible)")
	hostRoot := fs.String("host-root", "/", "the filesystem the loader, libraries and nsenter are taken from")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binary == "" || (*layoutDir == "" && *archive == "") {
		return fmt.Errorf("--binary and one of --layout or --archive are required")
	}
	createdAt, err := parseTime(*created)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	img, err := imagebuild.Build(imagebuild.Options{
		Binary:      *binary,
		HostRoot:    *hostRoot,
		Executables: imagebuild.DefaultExecutables,
		Libraries:   imagebuild.DefaultLibraries,
		Version:     *version,
		Commit:      *commit,
		Created:     createdAt,
	})
	if err != nil {
		return err
	}
	if *layoutDir != "" {
		if err := imagebuild.WriteLayout(*layoutDir, img, *ref); err != nil {
			return err
		}
	}
	if *archive != "" {
		if err := imagebuild.WriteArchive(*archive, img, *ref); err != nil {
			return err
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := imagebuild.CompressedSize(img)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s, %.1f MiB compressed\n", *ref, digest, float64(size)/(1<<20))
	return nil
}

func parseTime(s string) (time.Time, error) {
	if secs, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(secs, 0).UTC(), nil
	}
	return time.Parse(time.RFC3339, s)
}
