package deviceclasses

import (
	"testing"
)

func TestAll(t *testing.T) {
	classes, err := All()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		GPU:  "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
		MIG:  "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
		VFIO: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
	}
	wantExtendedName := map[string]string{GPU: "nvidia.com/gpu"}
	for _, p := range migProfiles(t) {
		want["mig-"+p+".nvidia.com"] = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '" + p + "'"
		wantExtendedName["mig-"+p+".nvidia.com"] = "nvidia.com/mig-" + p
	}
	if len(classes) != len(want) {
		t.Fatalf("got %d classes, want %d", len(classes), len(want))
	}
	for _, c := range classes {
		if c.APIVersion != "resource.k8s.io/v1" || c.Kind != "DeviceClass" {
			t.Errorf("%s: apiVersion %q kind %q", c.Name, c.APIVersion, c.Kind)
		}
		if len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil {
			t.Fatalf("%s: want one CEL selector, got %+v", c.Name, c.Spec.Selectors)
		}
		if got := c.Spec.Selectors[0].CEL.Expression; got != want[c.Name] {
			t.Errorf("%s: expression %q, want %q", c.Name, got, want[c.Name])
		}
		// Only whole GPUs answer the classic nvidia.com/gpu request, as in
		// NVIDIA's chart; each MIG profile's class answers the mixed
		// strategy's nvidia.com/mig-<profile>.
		var gotExtended string
		if c.Spec.ExtendedResourceName != nil {
			gotExtended = *c.Spec.ExtendedResourceName
		}
		if wantExtended := wantExtendedName[c.Name]; gotExtended != wantExtended {
			t.Errorf("%s: extendedResourceName %q, want %q", c.Name, gotExtended, wantExtended)
		}
	}
}

func TestComputeDomain(t *testing.T) {
	classes, err := ComputeDomain()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		ComputeDomainDaemon:  "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'",
		ComputeDomainChannel: "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0",
	}
	if len(classes) != len(want) {
		t.Fatalf("got %d classes, want %d", len(classes), len(want))
	}
	for _, c := range classes {
		if c.APIVersion != "resource.k8s.io/v1" || c.Kind != "DeviceClass" || c.Spec.ExtendedResourceName != nil {
			t.Errorf("%s: %+v", c.Name, c)
		}
		if len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil || c.Spec.Selectors[0].CEL.Expression != want[c.Name] {
			t.Errorf("%s: selectors %+v, want %q", c.Name, c.Spec.Selectors, want[c.Name])
		}
	}
	// The GPU driver's classes stay apart: the chart and the local cluster
	// install All() with the GPU driver.
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if _, ok := want[c.Name]; ok {
			t.Errorf("All() holds %s", c.Name)
		}
	}
}
