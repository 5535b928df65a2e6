package containerruntime_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/devnodes"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/mps"
)

const driverName = "gpu.nvidia.com"

// TestContainersSeeTheirDevices starts containerd on a simulated DGX A100
// node (GPU 1 in MIG mode, GPUs 4-7 whole), writes gpudra's CDI specs for claims of one
// GPU, one MIG device, one MPS-shared GPU and two GPUs, and runs a busybox
// container per claim (and one with no claim) through the CRI with the
// claim's CDI devices. Each container
// lists its /dev/nvidia* and /dev/nvidia-caps nodes, its environment and
// the files it should see; the test checks it sees exactly its device's
// nodes and the control nodes, with the numbers of the real nodes under the
// simulated node's dev root, the spec's environment, and (MPS) the daemon's
// pipe directory with a file the host put there.
func TestContainersSeeTheirDevices(t *testing.T) {
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)

	node := loadNode(t)
	dir := t.TempDir()
	devRoot := filepath.Join(dir, "devroot")
	nodes, err := devnodes.Nodes(node.inv, devnodes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := devnodes.Create(devRoot, nodes); err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(dir, "cdi")
	n := startNode(t, ctx, dir, cdiDir)
	writer, err := cdi.NewWriter(cdiDir, driverName)
	if err != nil {
		t.Fatal(err)
	}

	mig := node.migOn(t, 1)
	mpsDirs := mps.DirsOf(filepath.Join(dir, "mps"), "claim-mps")
	for _, d := range []string{mpsDirs.Pipe, mpsDirs.Log, mpsDirs.Shm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mpsDirs.Pipe, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	allGPUNodes := []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7"}
	control := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}
	tests := []struct {
		name      string
		devices   []*devicemodel.Device
		edits     *cdispec.ContainerEdits // each device's
		wantNodes []string
		wantEnv   []string
		wantFiles []string // paths the container must see besides its nodes
	}{
		{
			name: "no claim",
		},
		{
			name:      "one GPU",
			devices:   []*devicemodel.Device{node.device(t, "gpu-4")},
			wantNodes: append([]string{"/dev/nvidia4"}, control...),
			wantEnv:   []string{"NVIDIA_VISIBLE_DEVICES=void"},
		},
		{
			name:    "MIG device",
			devices: []*devicemodel.Device{mig},
			wantNodes: append([]string{
				"/dev/nvidia-caps/nvidia-cap" + fmt.Sprint(mig.MIG.GICapMinor),
				"/dev/nvidia-caps/nvidia-cap" + fmt.Sprint(mig.MIG.CICapMinor),
				"/dev/nvidia1",
			}, control...),
			wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=void"},
		},
		{
			name:      "MPS share",
			devices:   []*devicemodel.Device{node.device(t, "gpu-5")},
			edits:     mps.Daemon{Dirs: mpsDirs}.ContainerEdits(),
			wantNodes: append([]string{"/dev/nvidia5"}, control...),
			wantEnv: []string{
				"NVIDIA_VISIBLE_DEVICES=void",
				mps.EnvPipeDirectory + "=" + mps.ContainerPipeDir,
				mps.EnvLogDirectory + "=" + mps.ContainerLogDir,
			},
			wantFiles: []string{mps.ContainerPipeDir + "/control"},
		},
		{
			name:      "two GPUs",
			devices:   []*devicemodel.Device{node.device(t, "gpu-6"), node.device(t, "gpu-7")},
			wantNodes: append([]string{"/dev/nvidia6", "/dev/nvidia7"}, control...),
			wantEnv:   []string{"NVIDIA_VISIBLE_DEVICES=void"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			claimUID := fmt.Sprintf("0000000%d-1111-2222-3333-444444444444", i)
			var specDevices []cdi.SpecDevice
			var ids []*runtimeapi.CDIDevice
			for _, d := range tc.devices {
				specDevices = append(specDevices, cdi.SpecDevice{Device: d, Edits: tc.edits})
				ids = append(ids, &runtimeapi.CDIDevice{Name: cdi.DeviceID(driverName, claimUID, d.Name())})
			}
			if len(specDevices) > 0 {
				spec, err := cdi.BuildSpec(cdi.SpecInput{
					DriverName: driverName,
					ClaimUID:   claimUID,
					Majors:     node.inv.Majors,
					Devices:    specDevices,
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := writer.Write(claimUID, spec); err != nil {
					t.Fatal(err)
				}
			}
			// Each node with its numbers in hex, as stat prints them.
			script := "find /dev -type c -name 'nvidia*' -exec stat -c 'node %n %t:%T' {} +; env | sed 's/^/env /'"
			for _, f := range tc.wantFiles {
				script += fmt.Sprintf("; test -e %s && echo file %s", f, f)
			}
			out := n.run(t, ctx, fmt.Sprintf("pod-%d", i), &runtimeapi.ContainerConfig{
				Image:      &runtimeapi.ImageSpec{Image: containerruntime.TestImage},
				Command:    []string{"/bin/sh", "-c", script},
				CDIDevices: ids,
			})

			var gotNodes, gotEnv, gotFiles []string
			for _, line := range out {
				kind, rest, _ := strings.Cut(line, " ")
				switch kind {
				case "node":
					path, numbers, _ := strings.Cut(rest, " ")
					gotNodes = append(gotNodes, path)
					// The numbers are those of the node's real
					// device node under its dev root.
					var st unix.Stat_t
					if err := unix.Lstat(filepath.Join(devRoot, path), &st); err != nil {
						t.Errorf("container's %s: no such node under the dev root: %v", path, err)
					} else if want := fmt.Sprintf("%x:%x", unix.Major(st.Rdev), unix.Minor(st.Rdev)); numbers != want {
						t.Errorf("container's %s is %s, the dev root's %s", path, numbers, want)
					}
				case "env":
					gotEnv = append(gotEnv, rest)
				case "file":
					gotFiles = append(gotFiles, rest)
				}
			}
			slices.Sort(gotNodes)
			want := slices.Sorted(slices.Values(tc.wantNodes))
			if !slices.Equal(gotNodes, want) {
				t.Errorf("container's device nodes:\n%s\nwant:\n%s", strings.Join(gotNodes, "\n"), strings.Join(want, "\n"))
			}
			for _, n := range allGPUNodes {
				if slices.Contains(gotNodes, n) != slices.Contains(want, n) {
					t.Errorf("container sees %s: %v, want %v", n, slices.Contains(gotNodes, n), slices.Contains(want, n))
				}
			}
			for _, e := range tc.wantEnv {
				if !slices.Contains(gotEnv, e) {
					t.Errorf("container's environment lacks %s; it has %q", e, gotEnv)
				}
			}
			if !slices.Equal(gotFiles, tc.wantFiles) {
				t.Errorf("container sees files %q, want %q", gotFiles, tc.wantFiles)
			}
		})
	}
}
