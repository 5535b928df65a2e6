package controlplane

import (
	"strings"
	"testing"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// TestEmulatedFeatureDefaults checks that emulating a version gives its
// feature-gate defaults to the whole process, which is what the version
// table in docs/guides/install.md rests on.
func TestEmulatedFeatureDefaults(t *testing.T) {
	oldest, newest, err := VersionRange()
	if err != nil {
		t.Fatal(err)
	}
	if oldest != "1.34" || newest != "1.37" {
		t.Fatalf("range %s-%s; this test and the docs' table are written for 1.34-1.37: update both", oldest, newest)
	}
	// On from 1.36; off (alpha) at 1.34 and 1.35.
	from136 := []string{"DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints", "DRAExtendedResource", "DRADeviceBindingConditions", "ResourceHealthStatus"}
	// On at every version gpudra supports.
	always := []string{"DRAPrioritizedList", "DRAAdminAccess", "DRAResourceClaimDeviceStatus"}
	for _, v := range []string{"1.34", "1.35", "1.36", "1.37"} {
		t.Run(v, func(t *testing.T) {
			release, err := emulate(v, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			for _, g := range from136 {
				if got, want := FeatureEnabled(g), v >= "1.36"; got != want {
					t.Errorf("%s at %s: %t, want %t", g, v, got, want)
				}
			}
			for _, g := range always {
				if !FeatureEnabled(g) {
					t.Errorf("%s at %s: off, want on", g, v)
				}
			}
			// Beta but off by default in 1.37, absent before.
			if FeatureEnabled("DRAWorkloadResourceClaims") {
				t.Errorf("DRAWorkloadResourceClaims at %s: on, want off", v)
			}
		})
	}
	// Back to the build's version for the other tests of the process.
	release, err := emulate("", nil)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !FeatureEnabled("DRAPartitionableDevices") {
		t.Error("DRAPartitionableDevices off after going back to the build's version")
	}
}

func TestEmulationRefusals(t *testing.T) {
	for _, tc := range []struct{ version, want string }{
		{"1.33", "reaches 1.34 to 1.37"},
		{"1.38", "reaches 1.34 to 1.37"},
		{"2.0", "reaches 1.34 to 1.37"},
		{"one.thirty", `want a minor version from 1.34 to 1.37`},
	} {
		if _, err := ParseKubernetesVersion(tc.version); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.version, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{{"1.34", "1.34"}, {"v1.35", "1.35"}, {"1.36.2", "1.36"}, {"", "1.37"}} {
		if got, err := ParseKubernetesVersion(tc.in); err != nil || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}

	// While one control plane runs, another must agree on the version.
	release, err := emulate("1.37", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := emulate("1.34", nil); err == nil || !strings.Contains(err.Error(), "process-wide") {
		t.Errorf("a second version while one runs: %v, want a process-wide refusal", err)
	}
	release()

	for _, tc := range []struct{ in, want string }{
		{"DRAPartitionableDevices=yes", "must be true or false"},
		{"DRAPartitionableDevices", "is not NAME=true"},
		{"DRAPartitionable=true", `no such gate in Kubernetes; similar: DRAPartitionableDevices`},
		{"NoSuchThingAtAll=true", "no such gate"},
	} {
		if _, err := ParseFeatureGates(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	gates, err := ParseFeatureGates("DRAWorkloadResourceClaims=true, GenericWorkload=True")
	if err != nil || len(gates) != 2 || !gates["DRAWorkloadResourceClaims"] || !gates["GenericWorkload"] {
		t.Errorf("parse: %v, %v", gates, err)
	}
}

// TestRuntimeConfigOfGates: GenericWorkload on serves PodGroups
// (scheduling.k8s.io/v1beta1, a beta version kube-apiserver keeps off);
// without it the scheduler's PodGroup informer never syncs and the
// control plane never starts. Off, nothing beta is asked for.
func TestRuntimeConfigOfGates(t *testing.T) {
	for _, on := range []bool{false, true} {
		fg := utilfeature.DefaultMutableFeatureGate.DeepCopy()
		if err := fg.SetFromMap(map[string]bool{"GenericWorkload": on}); err != nil {
			t.Fatal(err)
		}
		got := runtimeConfigOf(fg)
		if want := on; (got["scheduling.k8s.io/v1beta1"] == "true") != want || (!on && len(got) != 0) {
			t.Errorf("GenericWorkload=%t: runtime config %v", on, got)
		}
	}
}
