package nvmlhw

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// NVIDIAMajor is the character-device major of /dev/nvidia<minor> and
// /dev/nvidiactl. The driver registers it statically.
const NVIDIAMajor = 195

// SystemInfo answers what NVML does not about the driver's device nodes.
type SystemInfo interface {
	// Majors returns the character-device majors of the driver's nodes.
	// A major the kernel has not registered (module not loaded) is 0.
	Majors() (hardware.Majors, error)
	// MIGCapMinors returns the table of MIG capability device minors.
	MIGCapMinors() (MIGCapMinors, error)
}

// MIGCapMinors maps the names of MIG capabilities, as the driver lists them
// in /proc/driver/nvidia-caps/mig-minors ("gpu0/gi1/access",
// "gpu0/gi1/ci0/access"), to the minors of their
// /dev/nvidia-caps/nvidia-cap<N> nodes. The GPU number in a name is the
// GPU's device minor, not its NVML index.
type MIGCapMinors map[string]int

// GI returns the minor of the access capability of GPU instance gi on the
// GPU with device minor gpuMinor.
func (m MIGCapMinors) GI(gpuMinor, gi int) (int, bool) {
	minor, ok := m[fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi)]
	return minor, ok
}

// CI returns the minor of the access capability of compute instance ci in
// GPU instance gi on the GPU with device minor gpuMinor.
func (m MIGCapMinors) CI(gpuMinor, gi, ci int) (int, bool) {
	minor, ok := m[fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci)]
	return minor, ok
}

// The driver's table covers a fixed number of GPUs, GPU instances per GPU
// and compute instances per GPU instance (MIG user guide, "Device Nodes and
// Capabilities": the table runs from "gpu0/gi0/access 3" to
// "gpu31/gi14/ci7/access 4322").
const (
	migCapGPUs         = 32
	migCapGIsPerGPU    = 15
	migCapCIsPerGI     = 8
	migCapFirstGIMinor = 3 // 1 is "config", 2 is "monitor"
)

// StandardMIGCapMinors returns the table the NVIDIA driver publishes in
// /proc/driver/nvidia-caps/mig-minors. The minors are predetermined: after
// "config 1" and "monitor 2", each GPU minor gets 15 GPU instances, each an
// access minor followed by the minors of its 8 compute instances, so
// gpu<g>/gi<i>/access is 3 + 135g + 9i and gpu<g>/gi<i>/ci<c>/access is that
// plus 1 + c. This matches the examples in the MIG user guide
// (gpu31/gi14/ci7/access 4322) and those quoted in NVIDIA's DRA driver
// (gpu3/gi3/ci3/access 439, gpu6/gi11/ci7/access 920).
func StandardMIGCapMinors() MIGCapMinors {
	m := make(MIGCapMinors, 2+migCapGPUs*migCapGIsPerGPU*(1+migCapCIsPerGI))
	m["config"] = 1
	m["monitor"] = 2
	minor := migCapFirstGIMinor
	for g := 0; g < migCapGPUs; g++ {
		for i := 0; i < migCapGIsPerGPU; i++ {
			m[fmt.Sprintf("gpu%d/gi%d/access", g, i)] = minor
			minor++
			for c := 0; c < migCapCIsPerGI; c++ {
				m[fmt.Sprintf("gpu%d/gi%d/ci%d/access", g, i, c)] = minor
				minor++
			}
		}
	}
	return m
}

// ParseMIGCapMinors reads a table in the format of
// /proc/driver/nvidia-caps/mig-minors: one "<name> <minor>" pair per line.
// name is used in error messages.
func ParseMIGCapMinors(r io.Reader, name string) (MIGCapMinors, error) {
	m := MIGCapMinors{}
	scanner := bufio.NewScanner(r)
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		if text == "" {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"<capability> <minor>\", got %q", name, line, text)
		}
		minor, err := strconv.Atoi(fields[1])
		if err != nil || minor < 0 {
			return nil, fmt.Errorf("%s:%d: minor %q is not a non-negative integer", name, line, fields[1])
		}
		m[fields[0]] = minor
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return m, nil
}

// procSystemInfo implements [SystemInfo] by reading procfs.
type procSystemInfo struct {
	root string
}

// NewProcSystemInfo returns a [SystemInfo] that reads the procfs mounted at
// procRoot (normally "/proc"): majors from <procRoot>/devices and MIG
// capability minors from <procRoot>/driver/nvidia-caps/mig-minors.
func NewProcSystemInfo(procRoot string) SystemInfo {
	return &procSystemInfo{root: procRoot}
}

// Majors implements [SystemInfo].
func (p *procSystemInfo) Majors() (hardware.Majors, error) {
	path := filepath.Join(p.root, "devices")
	f, err := os.Open(path)
	if err != nil {
		return hardware.Majors{}, fmt.Errorf("read device majors: %w", err)
	}
	defer f.Close()
	majors, err := parseProcDevices(f, path)
	if err != nil {
		return hardware.Majors{}, fmt.Errorf("read device majors: %w", err)
	}
	return majors, nil
}

// IMEXChannelsDeviceName is the name /proc/devices gives the major of the
// IMEX channel device nodes.
const IMEXChannelsDeviceName = "nvidia-caps-imex-channels"

// parseProcDevices reads the "Character devices:" section of /proc/devices.
func parseProcDevices(r io.Reader, name string) (hardware.Majors, error) {
	majors := hardware.Majors{NVIDIA: NVIDIAMajor}
	inChar := false
	scanner := bufio.NewScanner(r)
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		switch {
		case text == "":
			continue
		case strings.HasSuffix(text, ":"):
			inChar = text == "Character devices:"
			continue
		case !inChar:
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return hardware.Majors{}, fmt.Errorf("%s:%d: want \"<major> <name>\", got %q", name, line, text)
		}
		major, err := strconv.Atoi(fields[0])
		if err != nil {
			return hardware.Majors{}, fmt.Errorf("%s:%d: major %q is not an integer", name, line, fields[0])
		}
		// Exact names: "nvidia-caps-imex-channels" must not match "nvidia-caps".
		switch fields[1] {
		case "nvidia-uvm":
			majors.UVM = major
		case "nvidia-caps":
			majors.Caps = major
		case IMEXChannelsDeviceName:
			majors.IMEXChannels = major
		}
	}
	if err := scanner.Err(); err != nil {
		return hardware.Majors{}, fmt.Errorf("read %s: %w", name, err)
	}
	return majors, nil
}

// MIGCapMinors implements [SystemInfo].
func (p *procSystemInfo) MIGCapMinors() (MIGCapMinors, error) {
	path := filepath.Join(p.root, "driver", "nvidia-caps", "mig-minors")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read MIG capability minors: %w", err)
	}
	defer f.Close()
	return ParseMIGCapMinors(f, path)
}
