package containerruntime

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

// The images a real node gets from this machine instead of a registry.
const (
	// PauseImage is the pod sandbox image, containerd's pinned sandbox
	// image (the kubelet names no sandbox image of its own).
	PauseImage = "localhost/gpudra/pause:v1"
	// TestImage is a busybox image for test containers: Debian's static
	// busybox with links for its applets.
	TestImage = "localhost/gpudra/busybox:v1"
)

// BusyboxPath is where Debian's busybox-static installs busybox.
const BusyboxPath = "/bin/busybox"

// busyboxApplets are the applets TestImage links, for commands tests run.
var busyboxApplets = []string{"sh", "ls", "cat", "env", "sleep", "echo", "test", "stat", "find", "mount", "grep", "head", "sort", "id", "sed", "wget"}

// created is every local image's creation time: fixed, so one program
// gives one image digest.
var created = time.Unix(0, 0).UTC()

// WritePauseImage writes PauseImage, holding the pause program of b, as an
// archive in dir and returns its path.
func WritePauseImage(dir string, b Binaries) (string, error) {
	img, err := imagebuild.BuildSmall(imagebuild.SmallOptions{
		Programs:   map[string]string{"/pause": b.path("pause")},
		Entrypoint: []string{"/pause"},
		Created:    created,
	})
	if err != nil {
		return "", fmt.Errorf("pause image: %w", err)
	}
	return writeArchive(dir, "pause.tar", img, PauseImage)
}

// WriteTestImage writes TestImage, made of this machine's static busybox
// (Debian: busybox-static), as an archive in dir and returns its path.
func WriteTestImage(dir string) (string, error) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return "", fmt.Errorf("test image needs a static busybox at %s (Debian: apt-get install busybox-static): %w", BusyboxPath, err)
	}
	links := map[string]string{}
	for _, a := range busyboxApplets {
		links["/bin/"+a] = "busybox"
	}
	img, err := imagebuild.BuildSmall(imagebuild.SmallOptions{
		Programs: map[string]string{BusyboxPath: BusyboxPath},
		Links:    links,
		Cmd:      []string{"/bin/sh"},
		Created:  created,
	})
	if err != nil {
		return "", fmt.Errorf("test image: %w", err)
	}
	return writeArchive(dir, "busybox.tar", img, TestImage)
}

func writeArchive(dir, name string, img v1.Image, ref string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	file := filepath.Join(dir, name)
	if err := imagebuild.WriteArchive(file, img, ref); err != nil {
		return "", err
	}
	return file, nil
}
