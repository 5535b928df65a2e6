package claimconfig

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// fuzzDevices are one device of each kind, as the plugin's device list
// names them.
var fuzzDevices = []string{"gpu-0", "gpu-1-mig-1g10gb-19-0", "gpu-vfio-2"}

// fuzzKindOf tells the kind of fuzzDevices (and of nothing else).
func fuzzKindOf(r resourceapi.DeviceRequestAllocationResult) (DeviceKind, error) {
	switch {
	case strings.HasPrefix(r.Device, "gpu-vfio-"):
		return VFIO, nil
	case strings.Contains(r.Device, "-mig-"):
		return MIG, nil
	case strings.HasPrefix(r.Device, "gpu-"):
		return GPU, nil
	}
	return "", fmt.Errorf("no such device")
}

// fuzzClaim is a claim allocated one device of each kind, with classDoc as
// a class config and claimDoc as a claim config; layout's bits pick which
// requests the configs name, whether the GPU came from a subrequest, and
// adds a config of another driver that is not even JSON.
func fuzzClaim(classDoc, claimDoc []byte, layout uint8) *resourceapi.ResourceClaim {
	gpuRequest := "gpu"
	if layout&1 != 0 {
		gpuRequest = "gpu/sub"
	}
	var classRequests, claimRequests []string
	if layout&2 != 0 {
		classRequests = []string{"gpu"}
	}
	switch layout >> 2 & 3 {
	case 1:
		claimRequests = []string{"mig"}
	case 2:
		claimRequests = []string{"vfio", "gpu/sub"}
	case 3:
		claimRequests = []string{"nothing"}
	}
	configs := []resourceapi.DeviceAllocationConfiguration{
		class(string(classDoc), classRequests...),
		claimCfg(string(claimDoc), claimRequests...),
	}
	if layout&16 != 0 {
		configs = append([]resourceapi.DeviceAllocationConfiguration{otherDriver(claimCfg(notJSONDoc))}, configs...)
	}
	return newClaim(configs,
		result(gpuRequest+"="+fuzzDevices[0]), result("mig="+fuzzDevices[1]), result("vfio="+fuzzDevices[2]))
}

// FuzzResolve feeds arbitrary parameters to Resolve as a class config and a
// claim config of a claim with one device of each kind. Resolve never
// panics, agrees with ValidateOpaque (the webhook's entry point: a claim
// it admits resolves, one it refuses does not), and every device it
// resolves gets a valid config of its own kind.
func FuzzResolve(f *testing.F) {
	for i, seed := range fuzzSeeds {
		f.Add([]byte(seed), []byte(fuzzSeeds[(i+7)%len(fuzzSeeds)]), uint8(i))
	}
	f.Add([]byte(gpuTSLong), []byte(migMPS), uint8(4))
	f.Add([]byte(gpuMPS), []byte(`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}`), uint8(8))
	f.Fuzz(func(t *testing.T, classDoc, claimDoc []byte, layout uint8) {
		features := v1beta1.Features{}
		if layout&32 != 0 {
			features = allFeatures
		}
		claim := fuzzClaim(classDoc, claimDoc, layout)
		devices, err := Resolve(driver, claim, fuzzKindOf, features)

		classErr := ValidateOpaque(driver, opaque(driver, string(classDoc)), features)
		claimErr := ValidateOpaque(driver, opaque(driver, string(claimDoc)), features)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("Resolve error without a message")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Resolve error %q is no ConfigError", err)
			}
			if ce.Origin.Index < 0 {
				t.Fatalf("ConfigError %q blames the default config", err)
			}
			return
		}
		if classErr != nil || claimErr != nil {
			t.Fatalf("Resolve accepts configs ValidateOpaque refuses: class %v, claim %v", classErr, claimErr)
		}
		if len(devices) != len(fuzzDevices) {
			t.Fatalf("Resolve returned %d devices, want %d", len(devices), len(fuzzDevices))
		}
		for i, d := range devices {
			if d.Result.Device != fuzzDevices[i] {
				t.Fatalf("device %d is %s, want %s: allocation order lost", i, d.Result.Device, fuzzDevices[i])
			}
			if d.Config == nil || !fits(d.Config, d.Kind) {
				t.Fatalf("device %s (%s) got config %#v, which does not fit", d.Result.Device, d.Kind, d.Config)
			}
			if err := d.Config.Validate(features); err != nil {
				t.Fatalf("device %s got an invalid config from %s: %v", d.Result.Device, d.Origin, err)
			}
			if d.Origin.IsDefault() != (d.Origin.Index == -1) {
				t.Fatalf("device %s: inconsistent origin %+v", d.Result.Device, d.Origin)
			}
		}
		again, err := Resolve(driver, claim, fuzzKindOf, features)
		if err != nil || !equality.Semantic.DeepEqual(again, devices) {
			t.Fatalf("Resolve is not deterministic: %v", err)
		}
	})
}
