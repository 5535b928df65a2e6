package install

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// repoRoot is the root of the gpudra repository.
func repoRoot() string { return filepath.Join(ChartDir(), "..", "..", "..") }

// dryRunMake returns the commands `make -n <targets>` would run in the
// repository root, with VERSION, IMAGE and COMMIT left to the Makefile.
func dryRunMake(t *testing.T, targets ...string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-n"}, targets...)...)
	cmd.Dir = repoRoot()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "VERSION" && name != "IMAGE" && name != "COMMIT" && !strings.HasPrefix(name, "MAKE") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %v: %v\n%s", targets, err, out)
	}
	return string(out)
}

// TestOneVersion: the file VERSION is the one version of a release. The
// chart's appVersion, the image tag the chart renders by default, the tag
// `make image` builds and labels, and what `gpudra version` prints when
// built by `make build` are all that string, so that a chart installed as
// documented pulls the image `make image` built and pushed.
func TestOneVersion(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(raw))
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(version) {
		t.Fatalf("VERSION %q is not v<major>.<minor>.<patch>", version)
	}

	c := loadChart(t)
	if c.Metadata.AppVersion != version {
		t.Errorf("Chart.yaml appVersion %q, VERSION %q", c.Metadata.AppVersion, version)
	}
	want := "ghcr.io/gpudra/gpudra:" + version
	images := map[string]bool{}
	objs := render(t, Options{})
	for _, d := range all[*appsv1.DaemonSet](objs) {
		images = podImages(images, d.Spec.Template.Spec)
	}
	for _, d := range all[*appsv1.Deployment](objs) {
		images = podImages(images, d.Spec.Template.Spec)
	}
	if len(images) != 1 || !images[want] {
		t.Errorf("the default render runs images %v, want only %s", images, want)
	}

	image := dryRunMake(t, "image")
	for _, arg := range []string{"--tag " + want, "--version " + version, "pkg/version.version=" + version + " "} {
		if !strings.Contains(image, arg) {
			t.Errorf("make image does not pass %q:\n%s", arg, image)
		}
	}

	// Build as `make build` does, into a temporary directory, and ask
	// both binaries.
	build := strings.TrimSpace(dryRunMake(t, "build"))
	if !strings.HasPrefix(build, "go build ") || !strings.Contains(build, " -o bin/ ") {
		t.Fatalf("make build runs %q; the test expects one go build -o bin/", build)
	}
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", strings.Replace(build, " -o bin/ ", " -o "+dir+"/ ", 1))
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, out)
	}
	for _, name := range []string{"gpudra", "gpudra-node"} {
		out, err := exec.Command(filepath.Join(dir, name), "version", "-o", "json").Output()
		if err != nil {
			t.Fatalf("%s version: %v", name, err)
		}
		var info struct{ Version string }
		if err := json.Unmarshal(out, &info); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if info.Version != version {
			t.Errorf("%s version prints %q, VERSION %q", name, info.Version, version)
		}
	}
}

// podImages adds the images of a pod's containers and init containers.
func podImages(images map[string]bool, spec corev1.PodSpec) map[string]bool {
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		images[c.Image] = true
	}
	return images
}
