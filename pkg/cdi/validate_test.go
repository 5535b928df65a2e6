package cdi_test

import (
	"encoding/json"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
)

// libraryRefuses reports whether the CDI library refuses to write spec
// (Cache.WriteSpec, which validates it in memory first), and why.
func libraryRefuses(t *testing.T, spec *cdispec.Spec) error {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(t.TempDir()), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	return cache.WriteSpec(spec, "spec.json")
}

// TestValidateAgreesWithTheLibrary: the writer's validation accepts what
// the CDI library accepts and refuses what it refuses, for specs as
// BuildSpec makes them and for each way one can be wrong.
func TestValidateAgreesWithTheLibrary(t *testing.T) {
	n := loadNode(t)
	for _, tc := range []struct {
		name    string
		mutate  func(*cdispec.Spec)
		refused bool
	}{
		{"as built", func(*cdispec.Spec) {}, false},
		{"spec-wide edits", func(s *cdispec.Spec) {
			s.ContainerEdits = cdispec.ContainerEdits{Env: []string{"A=b"}, Mounts: []*cdispec.Mount{{HostPath: "/a", ContainerPath: "/b"}}}
		}, false},
		{"a device with only a hook", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits = cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "createContainer", Path: "/bin/true"}}}
		}, false},
		{"a device with only extra GIDs", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits = cdispec.ContainerEdits{AdditionalGIDs: []uint32{44}}
			s.Version = "0.7.0"
		}, false},
		{"no devices", func(s *cdispec.Spec) { s.Devices = nil }, true},
		{"a device twice", func(s *cdispec.Spec) { s.Devices = append(s.Devices, s.Devices[0]) }, true},
		{"a device without edits", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits = cdispec.ContainerEdits{} }, true},
		{"a device with empty edit lists", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits = cdispec.ContainerEdits{Env: []string{}, DeviceNodes: []*cdispec.DeviceNode{}}
		}, true},
		{"an empty device name", func(s *cdispec.Spec) { s.Devices[0].Name = "" }, true},
		{"a device name with a slash", func(s *cdispec.Spec) { s.Devices[0].Name = "a/b" }, true},
		{"a device name starting with a dash", func(s *cdispec.Spec) { s.Devices[0].Name = "-a" }, true},
		{"a kind without a class", func(s *cdispec.Spec) { s.Kind = "no-class" }, true},
		{"a kind without a vendor", func(s *cdispec.Spec) { s.Kind = "/claim" }, true},
		{"a vendor with a space", func(s *cdispec.Spec) { s.Kind = "k8s.gpu nvidia.com/claim" }, true},
		{"a class with a space", func(s *cdispec.Spec) { s.Kind = "k8s.gpu.nvidia.com/cl aim" }, true},
		{"an unknown version", func(s *cdispec.Spec) { s.Version = "9.9.9" }, true},
		{"no version", func(s *cdispec.Spec) { s.Version = "" }, true},
		{"a version older than the spec needs", func(s *cdispec.Spec) { s.Version = "0.3.0" }, true},
		{"an env entry without =", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits.Env = append(s.Devices[0].ContainerEdits.Env, "NOVALUE")
		}, true},
		{"a spec-wide env entry without =", func(s *cdispec.Spec) { s.ContainerEdits.Env = []string{"NOVALUE"} }, true},
		{"a device node of an unknown type", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits.DeviceNodes[0].Type = "x" }, true},
		{"a device node without a path", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits.DeviceNodes[0].Path = "" }, true},
		{"a mount without a container path", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits.Mounts = []*cdispec.Mount{{HostPath: "/a"}}
		}, true},
		{"a hook of an unknown kind", func(s *cdispec.Spec) {
			s.Devices[0].ContainerEdits.Hooks = []*cdispec.Hook{{HookName: "whenever", Path: "/bin/true"}}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := buildSpec(t, n, claimUID, nil, "gpu-4", "gpu-5")
			tc.mutate(spec)
			ours, library := cdi.Validate(spec), libraryRefuses(t, spec)
			if (ours != nil) != tc.refused || (library != nil) != tc.refused {
				t.Errorf("validate = %v, library = %v; want refused = %v", ours, library, tc.refused)
			}
		})
	}
}

// FuzzValidateAgreesWithTheLibrary: for any spec, the writer's validation
// and the CDI library's give the same answer.
func FuzzValidateAgreesWithTheLibrary(f *testing.F) {
	for _, seed := range fuzzSpecSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec cdispec.Spec
		if json.Unmarshal(data, &spec) != nil {
			return
		}
		ours, library := cdi.Validate(&spec), libraryRefuses(t, &spec)
		if (ours == nil) != (library == nil) {
			t.Fatalf("validate = %v, library = %v, for %s", ours, library, data)
		}
	})
}
