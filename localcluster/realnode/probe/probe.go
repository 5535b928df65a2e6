// Package probe is what a container on a real node of the local cluster
// runs to say what it sees (its NVIDIA device nodes, IMEX channel nodes,
// MPS pipe directory, DRA device metadata files and environment), and the
// parser of its log. The
// tests and gpudra-sim's report check a claim's devices against it: what
// the container itself saw, not what the CDI spec promised.
package probe

import (
	"bufio"
	"fmt"
	"slices"
	"strings"
)

// Markers delimit the sections of the output.
const (
	markerDevices = "--- gpudra probe: devices"
	markerMPS     = "--- gpudra probe: mps"
	// markerMetadata lists the device metadata files (KEP-5304) the
	// container has: a "file PATH" line, then the file on one line.
	markerMetadata = "--- gpudra probe: metadata"
	markerEnv      = "--- gpudra probe: env"
	markerEnd      = "--- gpudra probe: end"
)

// MetadataDir is where the kubelet plugin helper mounts the device
// metadata files of a container's claims.
const MetadataDir = "/var/run/kubernetes.io/dra-device-attributes"

// script prints the character devices under /dev/nvidia*,
// /dev/nvidia-caps/ and /dev/nvidia-caps-imex-channels/, the MPS pipe
// directory if CUDA_MPS_PIPE_DIRECTORY names one that exists, every
// device metadata file under MetadataDir, and the environment; in a busybox (or any POSIX) shell. Then it sleeps for
// sleepSeconds (0: exits), so that a test can restart things under a
// running container.
const script = `echo '` + markerDevices + `'
for f in /dev/nvidia* /dev/nvidia-caps/* /dev/nvidia-caps-imex-channels/*; do [ -c "$f" ] && echo "$f"; done
echo '` + markerMPS + `'
if [ -n "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_PIPE_DIRECTORY" ]; then echo "$CUDA_MPS_PIPE_DIRECTORY"; fi
echo '` + markerMetadata + `'
if [ -d ` + MetadataDir + ` ]; then find ` + MetadataDir + ` -type f | while read -r f; do echo "file $f"; tr -d '\n' < "$f"; echo; done; fi
echo '` + markerEnv + `'
env
echo '` + markerEnd + `'
`

// Command returns the container command (for a busybox image: sh -c) that
// prints what the container sees, then sleeps sleepSeconds (0: none).
func Command(sleepSeconds int) []string {
	s := script
	if sleepSeconds > 0 {
		s += fmt.Sprintf("exec sleep %d\n", sleepSeconds)
	}
	return []string{"sh", "-c", s}
}

// Seen is what a container saw.
type Seen struct {
	// DeviceNodes are the character devices, sorted.
	DeviceNodes []string `json:"deviceNodes"`
	// MPSPipeDirectory is CUDA_MPS_PIPE_DIRECTORY where it exists in the
	// container; empty otherwise.
	MPSPipeDirectory string `json:"mpsPipeDirectory,omitempty"`
	// Metadata are the device metadata files under MetadataDir, by path,
	// each with its newlines removed.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Env is the environment (the kubelet's service variables and all).
	Env map[string]string `json:"env"`
}

// Parse reads a probe's output (the container's log lines, without the
// runtime's prefixes) and reports whether it was complete.
func Parse(output string) (*Seen, bool) {
	seen := &Seen{DeviceNodes: []string{}, Env: map[string]string{}}
	section := ""
	complete := false
	metadataFile := ""
	s := bufio.NewScanner(strings.NewReader(output))
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		line := s.Text()
		switch line {
		case markerDevices, markerMPS, markerMetadata, markerEnv:
			section = line
			continue
		case markerEnd:
			complete = section == markerEnv
			section = ""
			continue
		}
		switch section {
		case markerDevices:
			seen.DeviceNodes = append(seen.DeviceNodes, line)
		case markerMPS:
			seen.MPSPipeDirectory = line
		case markerMetadata:
			if f, ok := strings.CutPrefix(line, "file "); ok && metadataFile == "" {
				metadataFile = f
				continue
			}
			if metadataFile != "" {
				if seen.Metadata == nil {
					seen.Metadata = map[string]string{}
				}
				seen.Metadata[metadataFile] = line
				metadataFile = ""
			}
		case markerEnv:
			if k, v, ok := strings.Cut(line, "="); ok {
				seen.Env[k] = v
			}
		}
	}
	slices.Sort(seen.DeviceNodes)
	return seen, complete
}
