package probe

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestParse checks the parser on complete, cut and empty outputs.
func TestParse(t *testing.T) {
	full := markerDevices + "\n/dev/nvidiactl\n/dev/nvidia3\n" + markerMPS + "\n/tmp/mps\n" + markerMetadata + "\nfile /m/a.json\n{\"a\": 1}\nfile /m/empty.json\n\n" + markerEnv + "\nA=1\nNVIDIA_VISIBLE_DEVICES=void\nB=x=y\n" + markerEnd + "\n"
	for _, tc := range []struct {
		name     string
		output   string
		want     *Seen
		complete bool
	}{
		{"complete", full, &Seen{DeviceNodes: []string{"/dev/nvidia3", "/dev/nvidiactl"}, MPSPipeDirectory: "/tmp/mps", Metadata: map[string]string{"/m/a.json": `{"a": 1}`, "/m/empty.json": ""}, Env: map[string]string{"A": "1", "NVIDIA_VISIBLE_DEVICES": "void", "B": "x=y"}}, true},
		{"cut before the end", strings.TrimSuffix(full, markerEnd+"\n"), &Seen{DeviceNodes: []string{"/dev/nvidia3", "/dev/nvidiactl"}, MPSPipeDirectory: "/tmp/mps", Metadata: map[string]string{"/m/a.json": `{"a": 1}`, "/m/empty.json": ""}, Env: map[string]string{"A": "1", "NVIDIA_VISIBLE_DEVICES": "void", "B": "x=y"}}, false},
		{"no probe", "hello\n", &Seen{DeviceNodes: []string{}, Env: map[string]string{}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, complete := Parse(tc.output)
			if complete != tc.complete || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse: %+v, complete %v; want %+v, %v", got, complete, tc.want, tc.complete)
			}
		})
	}
}

// TestCommandRuns runs the command with this machine's sh and checks
// that its output parses: the environment it is given comes back, and
// device nodes are listed only where they exist (no /dev/nvidia* here
// unless the machine has them).
func TestCommandRuns(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on this machine")
	}
	mps := t.TempDir()
	cmd := Command(0)
	c := exec.Command(sh, cmd[1:]...)
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "CUDA_MPS_PIPE_DIRECTORY=" + mps, "GPUDRA_PROBE=1"}
	out, err := c.Output()
	if err != nil {
		t.Fatal(err)
	}
	seen, complete := Parse(string(out))
	if !complete {
		t.Fatalf("output not complete:\n%s", out)
	}
	if seen.Env["GPUDRA_PROBE"] != "1" || seen.MPSPipeDirectory != mps {
		t.Errorf("env %v, MPS pipe directory %q; want GPUDRA_PROBE=1 and %s", seen.Env, seen.MPSPipeDirectory, mps)
	}
	host, _ := filepath.Glob("/dev/nvidia*")
	for _, d := range seen.DeviceNodes {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("device node %s listed but not there: %v", d, err)
		}
	}
	if len(host) == 0 && len(seen.DeviceNodes) != 0 {
		t.Errorf("device nodes %v on a machine without /dev/nvidia*", seen.DeviceNodes)
	}
}
