package pluginflags

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/simfleet"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// MPS launchers --mps-launcher accepts.
const (
	launcherProcess    = "process"
	launcherSystemdRun = "systemd-run"
)

// Sharing flags configure time-slicing and MPS.
type Sharing struct {
	nvidiaSMI      string
	mpsRoot        string
	mpsControl     string
	mpsLauncher    string
	nsenterPath    string
	systemdRunPath string
}

// AddFlags adds the flags to fs.
func (f *Sharing) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.nvidiaSMI, "nvidia-smi-path", "", "nvidia-smi, as this process sees it, for time-slicing (default: usr/bin/nvidia-smi under --container-driver-root); time-slicing is refused when it is missing")
	fs.StringVar(&f.mpsRoot, "mps-root", "/run/gpudra/mps", "directory of the MPS daemons' pipe, log and shm directories, on tmpfs and at the same path on the host and in the plugin's container (see docs/guides/mps.md)")
	fs.StringVar(&f.mpsControl, "mps-control-binary", "", "nvidia-cuda-mps-control, as this process sees it (default: usr/bin/nvidia-cuda-mps-control under --container-driver-root); MPS is refused when it is missing")
	fs.StringVar(&f.mpsLauncher, "mps-launcher", launcherProcess, fmt.Sprintf("how MPS daemons are started, one of [%s %s]: %s forks them from this process (a plugin on the host); %s starts each as a transient unit of the host's systemd, so it outlives a plugin container", launcherProcess, launcherSystemdRun, launcherProcess, launcherSystemdRun))
	fs.StringVar(&f.nsenterPath, "nsenter-path", "/usr/bin/nsenter", "with --mps-launcher=systemd-run: nsenter in the plugin's container, to reach the host's systemd (empty when the plugin runs on the host)")
	fs.StringVar(&f.systemdRunPath, "systemd-run-path", "/usr/bin/systemd-run", "with --mps-launcher=systemd-run: systemd-run as the host sees it")
}

// Validate checks the flags and cleans their paths.
func (f *Sharing) Validate() error {
	if f.mpsLauncher != launcherProcess && f.mpsLauncher != launcherSystemdRun {
		return fmt.Errorf("--mps-launcher %q: must be one of [%s %s]", f.mpsLauncher, launcherProcess, launcherSystemdRun)
	}
	if !filepath.IsAbs(f.mpsRoot) {
		return fmt.Errorf("--mps-root %q: must be an absolute path", f.mpsRoot)
	}
	// Paths of tools: empty ones mean "under the driver root" or, for
	// nsenter, "on the host itself"; a relative one would depend on the
	// working directory.
	paths := []PathFlag{{"systemd-run-path", &f.systemdRunPath}}
	for _, p := range []PathFlag{{"nvidia-smi-path", &f.nvidiaSMI}, {"mps-control-binary", &f.mpsControl}, {"nsenter-path", &f.nsenterPath}} {
		if *p.Value != "" {
			paths = append(paths, p)
		}
	}
	return AbsolutePaths(paths)
}

// TimeSlicer returns the setter for time slices, or nil when nvidia-smi is
// missing. Simulated GPUs (a fleet) keep their time slices in memory, or
// in a file of --sim-state-dir.
func (f *Sharing) TimeSlicer(hw *Discovery) (timeslicing.Setter, error) {
	if hw.Fleet != "" {
		if path := hw.SimStateFile(sim.TimeSlicesStateFile); path != "" {
			return timeslicing.LoadMemory(path)
		}
		return &timeslicing.Memory{}, nil
	}
	path := f.nvidiaSMI
	if path == "" {
		path = filepath.Join(hw.ContainerDriverRoot, "usr/bin/nvidia-smi")
	}
	if _, err := os.Stat(path); err != nil {
		return nil, nil
	}
	var opts []timeslicing.Option
	if hw.ContainerDriverRoot != "/" {
		for _, lib := range []string{"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "usr/lib64/libnvidia-ml.so.1", "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"} {
			if p := filepath.Join(hw.ContainerDriverRoot, lib); fileExists(p) {
				opts = append(opts, timeslicing.WithNVMLLibrary(p))
				break
			}
		}
	}
	return timeslicing.NewNvidiaSMI(path, opts...), nil
}

// MPSManager returns the MPS manager, or nil with the reason MPS is not
// available.
func (f *Sharing) MPSManager(hw *Discovery) (*mps.Manager, string) {
	path := f.mpsControl
	if path == "" {
		path = filepath.Join(hw.ContainerDriverRoot, "usr/bin", mps.DefaultControlBinary)
	}
	if !fileExists(path) {
		return nil, fmt.Sprintf("%s not found; see --mps-control-binary", path)
	}
	opts := []mps.Option{mps.WithControlBinary(path)}
	if f.mpsLauncher == launcherSystemdRun {
		opts = append(opts, mps.WithLauncher(mps.ProcessLauncher{Wrap: mps.SystemdRun(mps.SystemdRunOptions{NsenterPath: f.nsenterPath, SystemdRunPath: f.systemdRunPath})}))
	}
	m, err := mps.New(f.mpsRoot, opts...)
	if err != nil {
		return nil, err.Error()
	}
	return m, ""
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// GPUSharing flags say how full GPUs are shared between claims (KEP-5075
// consumable capacity): --sharing, NVIDIA's --consumable-shares for the
// same, and --sharing-default.
type GPUSharing struct {
	sharing          devicemodel.Sharing
	consumableShares string
	sharingDefault   string
}

// AddFlags adds the flags to fs.
func (f *GPUSharing) AddFlags(fs *pflag.FlagSet, help string) {
	fs.Var(&f.sharing, "sharing", help)
	fs.StringVar(&f.consumableShares, "consumable-shares", "", "--sharing under the name and values of NVIDIA's driver, so that its DaemonSet arguments carry over: disabled, memory (memory-compute), <N> (shares=<N>) or unlimited")
	fs.StringVar(&f.sharingDefault, "sharing-default", devicemodel.SharingDefaultWhole, fmt.Sprintf("what a claim that asks for no capacity gets on a shared GPU: %s (the whole GPU, uncapped) or %s (one share with shares=<N>, no memory with unlimited, as NVIDIA's driver gives)", devicemodel.SharingDefaultWhole, devicemodel.SharingDefaultShare))
}

// Validate checks the syntax of the flags Resolve reads, without a
// simulated node: what a node cannot change.
func (f *GPUSharing) Validate(fs *pflag.FlagSet) error {
	_, err := f.Resolve(fs, nil)
	return err
}

// Resolve returns the sharing the flags set, with what a simulated node
// sets where a flag was not given.
func (f *GPUSharing) Resolve(fs *pflag.FlagSet, fleetNode *simfleet.Node) (devicemodel.Sharing, error) {
	s := devicemodel.Sharing{}
	if fleetNode != nil {
		var err error
		if s, err = fleetNode.GPUSharing(); err != nil {
			return devicemodel.Sharing{}, err
		}
	}
	switch {
	case fs.Changed("sharing") && fs.Changed("consumable-shares"):
		return devicemodel.Sharing{}, fmt.Errorf("--sharing %s and --consumable-shares %s both given: --consumable-shares is NVIDIA's name for --sharing; give one", f.sharing, f.consumableShares)
	case fs.Changed("sharing"):
		s.Mode, s.Shares = f.sharing.Mode, f.sharing.Shares
	case fs.Changed("consumable-shares"):
		parsed, err := devicemodel.ParseConsumableShares(f.consumableShares)
		if err != nil {
			return devicemodel.Sharing{}, fmt.Errorf("--consumable-shares: %w", err)
		}
		s.Mode, s.Shares = parsed.Mode, parsed.Shares
	}
	if fs.Changed("sharing-default") || fleetNode == nil || fleetNode.SharingDefault == "" {
		byDefault, err := devicemodel.ParseSharingDefault(f.sharingDefault)
		if err != nil {
			return devicemodel.Sharing{}, fmt.Errorf("--sharing-default: %w", err)
		}
		s.ShareByDefault = byDefault
	}
	return s, nil
}
