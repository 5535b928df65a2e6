package imagebuild_test

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

// dockerfileStage is the part of a Dockerfile stage this test reads.
type dockerfileStage struct {
	from       string
	labels     map[string]string
	user       string
	entrypoint []string
	env        []string
	runs       []string
}

// readDockerfile returns the Dockerfile's stages, with line continuations
// joined and comments dropped.
func readDockerfile(t *testing.T) []dockerfileStage {
	t.Helper()
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	var cur strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		if s := strings.TrimSpace(cur.String()); s != "" {
			lines = append(lines, s)
		}
		cur.Reset()
	}
	var stages []dockerfileStage
	pair := regexp.MustCompile(`([A-Za-z0-9._-]+)=("[^"]*"|\S+)`)
	for _, line := range lines {
		instr, rest, _ := strings.Cut(line, " ")
		if strings.EqualFold(instr, "FROM") {
			stages = append(stages, dockerfileStage{from: rest, labels: map[string]string{}})
			continue
		}
		if len(stages) == 0 {
			continue
		}
		s := &stages[len(stages)-1]
		switch strings.ToUpper(instr) {
		case "LABEL":
			for _, m := range pair.FindAllStringSubmatch(rest, -1) {
				s.labels[m[1]] = strings.Trim(m[2], `"`)
			}
		case "USER":
			s.user = rest
		case "ENV":
			s.env = append(s.env, rest)
		case "RUN":
			s.runs = append(s.runs, rest)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &s.entrypoint); err != nil {
				t.Fatalf("Dockerfile ENTRYPOINT %s: want the exec (JSON) form: %v", rest, err)
			}
		}
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a builder and a runtime stage", len(stages))
	}
	return stages
}

// checkConfigMatchesDockerfile: the daemonless image's configuration is
// what the Dockerfile's final stage gives its image.
func checkConfigMatchesDockerfile(t *testing.T, cfg v1.Config) {
	t.Helper()
	stages := readDockerfile(t)
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.from, "debian:bookworm") {
		t.Errorf("Dockerfile runtime base %q: the daemonless image takes glibc from Debian 12 (bookworm) and PATH from debian's images; change both together", final.from)
	}
	if strings.Join(final.entrypoint, " ") != strings.Join(cfg.Entrypoint, " ") {
		t.Errorf("entrypoint: Dockerfile %q, image %q", final.entrypoint, cfg.Entrypoint)
	}
	if final.user != cfg.User {
		t.Errorf("user: Dockerfile %q, image %q", final.user, cfg.User)
	}
	if len(final.env) != 0 {
		t.Errorf("the Dockerfile's final stage sets ENV %q; the daemonless image sets only debian's PATH: set it in imagebuild too", final.env)
	}
	want := map[string]string{}
	for k, v := range cfg.Labels {
		want[k] = v
	}
	got := map[string]string{}
	for k, v := range final.labels {
		v = strings.ReplaceAll(v, "${VERSION}", cfg.Labels["org.opencontainers.image.version"])
		v = strings.ReplaceAll(v, "${COMMIT}", cfg.Labels["org.opencontainers.image.revision"])
		got[k] = v
	}
	if !maps.Equal(got, want) {
		t.Errorf("labels: Dockerfile %v, image %v", got, want)
	}
}

// TestDockerfileStampsVersion: the Dockerfile's build stamps the version
// and commit into the variables pkg/version reads, with make image's build
// tags, and copies the binaries where the image's entrypoint and the
// chart's DaemonSets expect them.
func TestDockerfileStampsVersion(t *testing.T) {
	stages := readDockerfile(t)
	var build string
	for _, run := range stages[0].runs {
		if strings.Contains(run, "go build") {
			build = run
		}
	}
	for _, want := range []string{
		"-X github.com/gpudra/gpudra/pkg/version.version=${VERSION}",
		"-X github.com/gpudra/gpudra/pkg/version.commit=${COMMIT}",
		"-tags " + buildTags,
		"./cmd/gpudra ./cmd/gpudra-node",
	} {
		if !strings.Contains(build, want) {
			t.Errorf("the builder's go build %q lacks %q", build, want)
		}
	}
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ name, path string }{{"gpudra", imagebuild.BinaryPath}, {"gpudra-node", imagebuild.NodeBinaryPath}} {
		if !strings.Contains(string(raw), "COPY --from=builder /out/"+b.name+" "+b.path+"\n") {
			t.Errorf("the Dockerfile does not copy %s to %s", b.name, b.path)
		}
	}
}
