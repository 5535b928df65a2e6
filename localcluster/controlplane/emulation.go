package controlplane

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/version"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/featuregate"
)

// Kubernetes' compatibility versions (KEP-4330) let one build behave as
// an older minor version: the API server serves the APIs and drops the
// fields that version lacks, and every feature gate takes that version's
// default. The emulation reaches back three minor versions from the
// build (k8s.io/apiserver pkg/util/compatibility), so a v1.37 build
// covers 1.34 to 1.37.
const emulationReach = 3

// VersionRange returns the oldest and the newest Kubernetes minor version
// ("1.34", "1.37") that Options.KubernetesVersion can name with this
// build.
func VersionRange() (oldest, newest string, err error) {
	binary, err := binaryMinor()
	if err != nil {
		return "", "", err
	}
	return minorString(binary.SubtractMinor(emulationReach)), minorString(binary), nil
}

// ParseKubernetesVersion checks a minor version ("1.34" or "v1.34";
// a patch part is ignored, since emulation is by minor version) against
// what this build can emulate and returns it as "1.34".
func ParseKubernetesVersion(s string) (string, error) {
	v, err := emulatedVersion(s)
	if err != nil {
		return "", err
	}
	return minorString(v), nil
}

func emulatedVersion(s string) (*version.Version, error) {
	binary, err := binaryMinor()
	if err != nil {
		return nil, err
	}
	if s == "" {
		return binary, nil
	}
	oldest := binary.SubtractMinor(emulationReach)
	v, err := version.ParseGeneric(s)
	if err != nil {
		return nil, fmt.Errorf("kubernetes version %q: want a minor version from %s to %s, e.g. %q", s, minorString(oldest), minorString(binary), minorString(oldest))
	}
	v = version.MajorMinor(v.Major(), v.Minor())
	if v.LessThan(oldest) || v.GreaterThan(binary) {
		return nil, fmt.Errorf("kubernetes version %q: this build is Kubernetes %s, and its compatibility-version emulation reaches %s to %s (%d minor versions back; older versions need a build of their own)",
			s, minorString(binary), minorString(oldest), minorString(binary), emulationReach)
	}
	return v, nil
}

// binaryMinor is the build's Kubernetes minor version.
func binaryMinor() (*version.Version, error) {
	s, err := KubernetesVersion()
	if err != nil {
		return nil, err
	}
	v, err := version.ParseSemantic(s)
	if err != nil {
		return nil, err
	}
	return version.MajorMinor(v.Major(), v.Minor()), nil
}

func minorString(v *version.Version) string {
	return fmt.Sprintf("%d.%d", v.Major(), v.Minor())
}

// The feature gates are process-wide: the API server's registry
// strategies, the controllers, the scheduler and the simulated kubelets
// all read k8s.io/apiserver's default gate. A control plane therefore sets
// the emulated version and the gate overrides on it, for every component
// of the process, and two control planes in one process must agree.
var emulation struct {
	mu      sync.Mutex
	running int
	version *version.Version
	// gates are the overrides set so far: a gate set explicitly stays
	// set for the process, so a later control plane must set the same.
	gates map[string]bool
}

// emulate sets the process's emulated version and gate overrides for a
// control plane that is starting, and returns the function that releases
// them when it stops. While a control plane runs, another may start only
// with the same version and gates; once none runs, the version may
// change, but gates once overridden stay as they were set (the feature
// gate cannot forget an override).
func emulate(kubernetesVersion string, gates map[string]bool) (release func(), err error) {
	v, err := emulatedVersion(kubernetesVersion)
	if err != nil {
		return nil, err
	}
	if err := checkGates(gates); err != nil {
		return nil, err
	}
	e := &emulation
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running > 0 && !v.EqualTo(e.version) {
		return nil, fmt.Errorf("kubernetes version %s: a control plane of Kubernetes %s runs in this process, and the version is process-wide (start another process)", minorString(v), minorString(e.version))
	}
	for name, on := range gates {
		if was, ok := e.gates[name]; ok && was != on {
			return nil, fmt.Errorf("feature gate %s=%t: this process already set it to %t, and feature gates are process-wide (start another process)", name, on, was)
		}
	}
	if e.running > 0 {
		for name := range e.gates {
			if _, ok := gates[name]; !ok {
				return nil, fmt.Errorf("feature gates: a control plane in this process set %s and this one does not; they are process-wide (start another process)", describeGates(e.gates))
			}
		}
	}
	fg := utilfeature.DefaultMutableFeatureGate
	// The minimum compatibility version is one minor below the emulated
	// one, as Kubernetes sets it, but no older than the oldest version the
	// build emulates: the API server refuses one outside that range.
	binary, err := binaryMinor()
	if err != nil {
		return nil, err
	}
	minCompat := v.SubtractMinor(1)
	if oldest := binary.SubtractMinor(emulationReach); minCompat.LessThan(oldest) {
		minCompat = oldest
	}
	if !v.EqualTo(fg.EmulationVersion()) || !minCompat.EqualTo(fg.MinCompatibilityVersion()) {
		if err := fg.SetEmulationVersionAndMinCompatibilityVersion(v, minCompat); err != nil {
			return nil, fmt.Errorf("emulate Kubernetes %s: %w", minorString(v), err)
		}
	}
	if len(gates) > 0 {
		if err := fg.SetFromMap(gates); err != nil {
			return nil, fmt.Errorf("feature gates %s: %w", describeGates(gates), err)
		}
	}
	if e.gates == nil {
		e.gates = map[string]bool{}
	}
	maps.Copy(e.gates, gates)
	e.version = v
	e.running++
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.running--
		})
	}, nil
}

// checkGates refuses a gate the build does not know, naming the known
// ones that look alike.
func checkGates(gates map[string]bool) error {
	known := utilfeature.DefaultMutableFeatureGate.GetAll()
	for _, name := range slices.Sorted(maps.Keys(gates)) {
		if _, ok := known[featuregate.Feature(name)]; ok {
			continue
		}
		var like []string
		for k := range known {
			if strings.Contains(strings.ToLower(string(k)), strings.ToLower(strings.TrimPrefix(name, "DRA"))) {
				like = append(like, string(k))
			}
		}
		sort.Strings(like)
		if len(like) > 0 {
			return fmt.Errorf("feature gate %q: no such gate in Kubernetes; similar: %s", name, strings.Join(like, ", "))
		}
		return fmt.Errorf("feature gate %q: no such gate in Kubernetes", name)
	}
	return nil
}

// FeatureEnabled reports whether a feature gate is on in this process: at
// the emulated version, with the overrides of the running control plane.
func FeatureEnabled(name string) bool {
	return utilfeature.DefaultFeatureGate.Enabled(featuregate.Feature(name))
}

// ParseFeatureGates parses a --feature-gates value ("A=true,B=false").
func ParseFeatureGates(s string) (map[string]bool, error) {
	out := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("feature gates %q: %q is not NAME=true or NAME=false", s, item)
		}
		switch strings.ToLower(val) {
		case "true":
			out[name] = true
		case "false":
			out[name] = false
		default:
			return nil, fmt.Errorf("feature gates %q: %s=%q: the value must be true or false", s, name, val)
		}
	}
	return out, checkGates(out)
}

func describeGates(gates map[string]bool) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(gates)) {
		parts = append(parts, fmt.Sprintf("%s=%t", name, gates[name]))
	}
	return strings.Join(parts, ",")
}

// gateAPIs are the API group versions, off by default in kube-apiserver
// (beta), that a feature gate's objects are served in: with the gate on
// and its version off, the API server serves none of them, and the
// scheduler's and controllers' informers for them never sync.
var gateAPIs = map[featuregate.Feature][]string{
	// PodGroups and Workloads (KEP-4671), which claims of a whole
	// workload (DRAWorkloadResourceClaims, KEP-5729) are reserved for.
	"GenericWorkload": {"scheduling.k8s.io/v1beta1"},
}

// runtimeConfigOf is kube-apiserver's --runtime-config for the gates fg
// enables: the API group versions of [gateAPIs] they need.
func runtimeConfigOf(fg featuregate.FeatureGate) cliflag.ConfigurationMap {
	out := cliflag.ConfigurationMap{}
	for gate, versions := range gateAPIs {
		if !fg.Enabled(gate) {
			continue
		}
		for _, v := range versions {
			out[v] = "true"
		}
	}
	return out
}
