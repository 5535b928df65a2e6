package imagebuild_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

// TestMultiPlatformImage builds `make image`'s image index: gpudra for
// amd64 and, cross-compiled with cgo, for arm64; the amd64 image from this
// machine's Debian and the arm64 image from a sysroot of Debian's arm64
// packages (../debian-sysroot); the index of the two, with cmd/build-image
// as `make image` runs it. It checks the index (two platforms, each
// descriptor's platform its image config's, one digest for one input),
// that every ELF file of the arm64 image is aarch64, and runs the arm64
// image's gpudra under qemu-user: `version -o json` and `inspect --fleet
// gb200-nvl72`, whose output must be the amd64 gpudra's. It skips only
// without the arm64 cross compiler or qemu-user, unless
// GPUDRA_REQUIRE_ARM64=1.
func TestMultiPlatformImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gpudra for two architectures")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("arm64 is the cross platform here; this test runs on amd64 machines (CI's)")
	}
	// CI installs both and sets GPUDRA_REQUIRE_ARM64=1, where a missing
	// one fails the test rather than skipping it.
	skip := t.Skip
	if os.Getenv("GPUDRA_REQUIRE_ARM64") == "1" {
		skip = t.Fatal
	}
	if _, err := exec.LookPath(crossCC["arm64"]); err != nil {
		skip("no C cross compiler for arm64, which the arm64 gpudra (cgo) needs (Debian: apt-get install gcc-aarch64-linux-gnu): ", err)
	}
	qemu := ""
	for _, name := range []string{"qemu-aarch64", "qemu-aarch64-static"} {
		if p, err := exec.LookPath(name); err == nil {
			qemu = p
			break
		}
	}
	if qemu == "" {
		skip("no qemu-aarch64 to run the arm64 image's gpudra with (Debian: apt-get install qemu-user)")
	}
	sysroot := arm64Sysroot(t)
	for _, exe := range imagebuild.DefaultExecutables {
		if _, err := os.Stat(exe); err != nil {
			t.Skipf("this machine lacks %s, which the amd64 image carries (Debian: util-linux): %v", exe, err)
		}
	}
	amd64Binary := gpudraBinary(t, "amd64")
	arm64Binary := gpudraBinary(t, "arm64")
	dir := t.TempDir()
	created := time.Unix(1700000000, 0).UTC()
	build := func(binary, root string) v1.Image {
		t.Helper()
		img, err := imagebuild.Build(imagebuild.Options{
			Binary:      binary,
			NodeBinary:  nodeBinary(binary),
			Root:        root,
			Executables: imagebuild.DefaultExecutables,
			Libraries:   imagebuild.DefaultLibraries,
			Version:     testVersion,
			Commit:      testCommit,
			Created:     created,
		})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	amd64Image := build(amd64Binary, "")
	arm64Image := build(arm64Binary, sysroot)
	if d1, d2 := digest(t, arm64Image), digest(t, build(arm64Binary, sysroot)); d1 != d2 {
		t.Errorf("two arm64 builds from the same input differ: %s, %s", d1, d2)
	}
	// The history names no path of this machine.
	cf, err := arm64Image.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range cf.History {
		if strings.Contains(h.CreatedBy, sysroot) {
			t.Errorf("the arm64 image's history names the sysroot's path: %q", h.CreatedBy)
		}
	}

	idx, err := imagebuild.Index(amd64Image, arm64Image)
	if err != nil {
		t.Fatal(err)
	}
	reversed, err := imagebuild.Index(arm64Image, amd64Image)
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := indexDigest(t, idx), indexDigest(t, reversed); d1 != d2 {
		t.Errorf("the index depends on the order of its images: %s, %s", d1, d2)
	}
	if _, err := imagebuild.Index(amd64Image, build(amd64Binary, "")); err == nil || !strings.Contains(err.Error(), "two images for linux/amd64") {
		t.Errorf("an index of two amd64 images: got %v", err)
	}

	// build-image, as `make image` runs it.
	layoutDir, archive := filepath.Join(dir, "image"), filepath.Join(dir, "gpudra-image.tar")
	cmd := exec.Command("go", "run", "./cmd/build-image",
		"--binary", amd64Binary, "--binary", arm64Binary, "--node-binary", nodeBinary(amd64Binary), "--node-binary", nodeBinary(arm64Binary), "--sysroot", "arm64="+sysroot,
		"--layout", layoutDir, "--archive", archive, "--tag", "ghcr.io/gpudra/gpudra:"+testVersion,
		"--version", testVersion, "--commit", testCommit, "--created", "1700000000")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build-image: %v\n%s", err, out)
	}
	t.Logf("build-image:\n%s", out)
	written := readIndexLayout(t, layoutDir)
	if d1, d2 := indexDigest(t, written), indexDigest(t, idx); d1 != d2 {
		t.Errorf("build-image wrote index %s, this test built %s from the same input", d1, d2)
	}
	images := checkIndex(t, written)
	for arch, img := range images {
		size, err := imagebuild.CompressedSize(img)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("linux/%s image %s: %.1f MiB compressed", arch, digest(t, img), float64(size)/(1<<20))
	}

	t.Run("archive holds this machine's platform", func(t *testing.T) {
		img, err := tarball.ImageFromPath(archive, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		want, err := images["amd64"].ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("the archive's image has config %s, the index's linux/amd64 image %s", got, want)
		}
	})

	rootfs := filepath.Join(dir, "arm64-rootfs")
	unpack(t, images["arm64"], rootfs)

	t.Run("every ELF file is aarch64", func(t *testing.T) {
		checkELFMachines(t, rootfs, elf.EM_AARCH64)
		for _, soname := range imagebuild.DefaultLibraries {
			if _, err := resolveIn(rootfs, "/lib/aarch64-linux-gnu/"+soname); err != nil {
				t.Errorf("the arm64 image lacks %s, which NVML needs: %v", soname, err)
			}
		}
	})

	t.Run("arm64 gpudra under qemu", func(t *testing.T) {
		loader := imageLoader{rootfs: rootfs, arch: "arm64", emulator: []string{qemu}}
		for _, exe := range append([]string{imagebuild.BinaryPath}, imagebuild.DefaultExecutables...) {
			loader.checkLibraries(t, exe)
		}
		// As a container runtime starts the entrypoint: the kernel (here
		// qemu, with -L) finds the loader the binary names in the image.
		inImage := func(args ...string) []byte {
			t.Helper()
			cmd := exec.Command(qemu, append([]string{"-L", rootfs, filepath.Join(rootfs, imagebuild.BinaryPath)}, args...)...)
			cmd.Env = []string{imagebuild.PathEnv}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderrOf(err))
			}
			return out
		}
		version := inImage("version", "-o", "json")
		t.Logf("gpudra version -o json (arm64, qemu):\n%s", version)
		checkVersionOutput(t, version, "linux/arm64")

		inspect := inImage("inspect", "--fleet", "gb200-nvl72")
		gpus := fleetGPUs(t, inspect)
		if len(gpus) != 72 {
			t.Errorf("inspect --fleet gb200-nvl72 under qemu lists %d GB200 GPUs, want 72 (18 nodes of 4):\n%s", len(gpus), inspect)
		}
		native := exec.Command(amd64Binary, "inspect", "--fleet", "gb200-nvl72")
		want, err := native.Output()
		if err != nil {
			t.Fatalf("amd64 gpudra inspect: %v\n%s", err, stderrOf(err))
		}
		if !bytes.Equal(inspect, want) {
			t.Errorf("inspect --fleet gb200-nvl72: arm64 under qemu printed\n%s\namd64 printed\n%s", inspect, want)
		}
		lines := strings.SplitN(string(inspect), "\n", 4)
		t.Logf("gpudra inspect --fleet gb200-nvl72 (arm64, qemu): %d GPUs on %d nodes; first lines:\n%s",
			len(gpus), len(distinctNodes(gpus)), strings.Join(lines[:min(3, len(lines))], "\n"))
	})
}

// arm64Sysroot is the Debian arm64 root the arm64 image's files come from:
// GPUDRA_SYSROOT_ARM64, or the one `make image` uses, set up by
// ../debian-sysroot when it is not there yet (it fetches Debian's arm64
// packages once, then has nothing to do).
func arm64Sysroot(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("GPUDRA_SYSROOT_ARM64"); dir != "" {
		return dir
	}
	dir, err := filepath.Abs("../../../_output/sysroot/arm64")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command("../debian-sysroot", "arm64", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("set up the arm64 sysroot: %v\n%s", err, out)
	}
	if len(out) > 0 {
		t.Logf("%s(%v)", out, time.Since(start).Round(time.Second))
	}
	return dir
}

func indexDigest(t *testing.T, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// readIndexLayout reads the image index that an OCI layout holds, tagged
// testVersion.
func readIndexLayout(t *testing.T, dir string) v1.ImageIndex {
	t.Helper()
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("layout has %d manifests, want 1 (the image index)", len(m.Manifests))
	}
	desc := m.Manifests[0]
	if desc.MediaType != types.OCIImageIndex {
		t.Fatalf("layout holds a %s, want an image index", desc.MediaType)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != testVersion {
		t.Errorf("ref.name annotation %q, want %q", got, testVersion)
	}
	idx, err := top.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// checkIndex checks that idx holds exactly a linux/amd64 and a linux/arm64
// image, in that order, each descriptor's platform its image
// configuration's, and returns the images by architecture.
func checkIndex(t *testing.T, idx v1.ImageIndex) map[string]v1.Image {
	t.Helper()
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", m.MediaType, types.OCIImageIndex)
	}
	var platforms []string
	images := map[string]v1.Image{}
	for _, desc := range m.Manifests {
		if desc.Platform == nil {
			t.Fatalf("manifest %s has no platform", desc.Digest)
		}
		platforms = append(platforms, desc.Platform.String())
		if desc.MediaType != types.OCIManifestSchema1 || desc.ArtifactType != "" {
			t.Errorf("%s: media type %s, artifact type %q; want %s and none", desc.Platform, desc.MediaType, desc.ArtifactType, types.OCIManifestSchema1)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != desc.Platform.OS || cf.Architecture != desc.Platform.Architecture {
			t.Errorf("the index says %s, the image's config %s/%s", desc.Platform, cf.OS, cf.Architecture)
		}
		images[desc.Platform.Architecture] = img
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Fatalf("index platforms %v, want %v", platforms, want)
	}
	return images
}

// checkELFMachines fails for every ELF file under rootfs of another
// machine than want: a library of this machine's architecture in another
// platform's image.
func checkELFMachines(t *testing.T, rootfs string, want elf.Machine) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return nil // not ELF
		}
		defer f.Close()
		n++
		if f.Machine != want {
			t.Errorf("%s: %v, want %v", strings.TrimPrefix(p, rootfs), f.Machine, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 4 {
		t.Errorf("%d ELF files in the image; want gpudra, gpudra-node, nsenter, the loader and libraries", n)
	}
}

// fleetGPU is one GPU row of `gpudra inspect`'s table.
type fleetGPU struct{ node, device, uuid string }

// fleetGPUs returns the rows of `gpudra inspect`'s table of type gpu and
// product NVIDIA GB200, each with a distinct UUID.
func fleetGPUs(t *testing.T, out []byte) []fleetGPU {
	t.Helper()
	var gpus []fleetGPU
	uuids := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// NODE DEVICE TYPE SHARING PRODUCT(2 words) MEMORY ... UUID
		if len(f) < 8 || f[2] != "gpu" || f[4]+" "+f[5] != "NVIDIA GB200" {
			continue
		}
		g := fleetGPU{node: f[0], device: f[1], uuid: f[len(f)-1]}
		if !strings.HasPrefix(g.uuid, "GPU-") || uuids[g.uuid] {
			t.Errorf("GPU %s/%s: UUID %q missing or repeated", g.node, g.device, g.uuid)
		}
		uuids[g.uuid] = true
		gpus = append(gpus, g)
	}
	return gpus
}

func distinctNodes(gpus []fleetGPU) map[string]bool {
	nodes := map[string]bool{}
	for _, g := range gpus {
		nodes[g.node] = true
	}
	return nodes
}
