package kubelet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// kernelTunables are the sysctls the kubelet's container manager sets on
// its host at start (vm.overcommit_memory=1, vm.panic_on_oom=0,
// kernel.panic=10, kernel.panic_on_oops=1, the keyring limits), as on
// any Kubernetes node; it refuses to start where it cannot
// (protectKernelDefaults only turns the change into a refusal). The local
// cluster runs on a developer's or CI's machine, not a node: the values
// the machine had are written back when the last real kubelet stops.
var kernelTunables = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// procSys is /proc/sys (a variable for tests).
var procSys = "/proc/sys"

// machineTunables holds the machine's own values while real kubelets run.
var machineTunables struct {
	mu      sync.Mutex
	running int
	saved   map[string]string
}

// saveTunables records the machine's values before the first kubelet
// starts.
func saveTunables() error {
	t := &machineTunables
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running == 0 {
		saved := map[string]string{}
		for _, name := range kernelTunables {
			v, err := os.ReadFile(filepath.Join(procSys, name))
			if err != nil {
				return fmt.Errorf("read sysctl %s before the kubelet changes it: %w", name, err)
			}
			saved[name] = strings.TrimSpace(string(v))
		}
		t.saved = saved
	}
	t.running++
	return nil
}

// restoreTunables writes the machine's values back once no kubelet runs.
func restoreTunables() error {
	t := &machineTunables
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running == 0 {
		return nil
	}
	t.running--
	if t.running > 0 {
		return nil
	}
	var errs []error
	for _, name := range kernelTunables {
		path := filepath.Join(procSys, name)
		cur, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(cur)) == t.saved[name] {
			continue
		}
		if err := os.WriteFile(path, []byte(t.saved[name]), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", name, t.saved[name], err))
		}
	}
	t.saved = nil
	return errors.Join(errs...)
}

// ChangedSysctls lists the machine's sysctls the running kubelets have
// changed, as "name=now (was before)" in dotted form (kernel.panic=10 (was
// 0)): for people, who did not ask for their machine's settings to
// change. The values are written back when the last kubelet stops (not if
// the process is killed).
func ChangedSysctls() []string {
	t := &machineTunables
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, name := range kernelTunables {
		was, ok := t.saved[name]
		if !ok {
			continue
		}
		now, err := os.ReadFile(filepath.Join(procSys, name))
		if err != nil || strings.TrimSpace(string(now)) == was {
			continue
		}
		out = append(out, fmt.Sprintf("%s=%s (was %s)", strings.ReplaceAll(name, "/", "."), strings.TrimSpace(string(now)), was))
	}
	return out
}
