package claimconfig

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

const driver = "gpu.nvidia.com"

var allFeatures = v1beta1.Features{TimeSlicingSettings: true, MPSSupport: true}

// result is an allocation result of driver: "request=device".
func result(s string) resourceapi.DeviceRequestAllocationResult {
	request, device, _ := strings.Cut(s, "=")
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver, Pool: "node-a", Device: device}
}

// cfg is an opaque config of driver with parameters doc.
func cfg(source resourceapi.AllocationConfigSource, doc string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver:     driver,
			Parameters: runtime.RawExtension{Raw: []byte(doc)},
		}},
	}
}

func class(doc string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return cfg(resourceapi.AllocationConfigSourceClass, doc, requests...)
}

func claimCfg(doc string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return cfg(resourceapi.AllocationConfigSourceClaim, doc, requests...)
}

func otherDriver(c resourceapi.DeviceAllocationConfiguration) resourceapi.DeviceAllocationConfiguration {
	c.Opaque.Driver = "nic.example.com"
	return c
}

// Parameters documents used across the tests.
const (
	gpuTS      = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}`
	gpuTSLong  = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}`
	gpuMPS     = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}`
	gpuExcl    = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}`
	migMPS     = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}`
	migTS      = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}`
	notJSONDoc = `{"apiVersion": `
)

func newClaim(configs []resourceapi.DeviceAllocationConfiguration, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{}
	claim.Namespace, claim.Name = "ns", "claim"
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: results,
		Config:  configs,
	}}
	return claim
}

// kindOf tells device kinds by name, as the plugin's device list would.
func kindOf(r resourceapi.DeviceRequestAllocationResult) (DeviceKind, error) {
	switch {
	case strings.Contains(r.Device, "-mig-"):
		return MIG, nil
	case strings.HasPrefix(r.Device, "gpu-vfio-"):
		return VFIO, nil
	case strings.HasPrefix(r.Device, "gpu-"):
		return GPU, nil
	}
	return "", fmt.Errorf("no such device")
}

// summary renders the resolution of each device as
// "device: origin: strategy/detail", to compare whole outcomes at once.
func summary(devices []Device) []string {
	var out []string
	for _, d := range devices {
		setting := "exclusive"
		switch c := d.Config.(type) {
		case *v1beta1.GpuConfig:
			if s := c.Sharing; s != nil {
				setting = string(s.Strategy)
				if s.TimeSlicingConfig != nil {
					setting += "/" + string(*s.TimeSlicingConfig.Interval)
				}
				if s.MpsConfig != nil && s.MpsConfig.DefaultActiveThreadPercentage != nil {
					setting += fmt.Sprintf("/%d%%", *s.MpsConfig.DefaultActiveThreadPercentage)
				}
			}
		case *v1beta1.MigDeviceConfig:
			if s := c.Sharing; s != nil {
				setting = "mig " + string(s.Strategy)
			}
		}
		out = append(out, fmt.Sprintf("%s: %s: %s", d.Result.Device, d.Origin, setting))
	}
	return out
}

func TestResolve(t *testing.T) {
	type (
		configs = []resourceapi.DeviceAllocationConfiguration
		results = []resourceapi.DeviceRequestAllocationResult
	)
	tests := map[string]struct {
		configs configs
		results results
		want    []string
	}{
		"no configs: defaults are exclusive": {
			results: results{result("a=gpu-0"), result("b=gpu-0-mig-1g.10gb-0-0")},
			want: []string{
				"gpu-0: default config: exclusive",
				"gpu-0-mig-1g.10gb-0-0: default config: exclusive",
			},
		},
		"class config applies": {
			configs: configs{class(gpuTS, "a")},
			results: results{result("a=gpu-0")},
			want:    []string{"gpu-0: class config #0 (requests [a]): TimeSlicing/Default"},
		},
		"claim config beats class config wherever it is listed": {
			configs: configs{claimCfg(gpuMPS), class(gpuTS, "a")},
			results: results{result("a=gpu-0")},
			want:    []string{"gpu-0: claim config #0 (all requests): MPS/50%"},
		},
		"later class config beats earlier": {
			configs: configs{class(gpuTS, "a"), class(gpuTSLong, "a")},
			results: results{result("a=gpu-0")},
			want:    []string{"gpu-0: class config #1 (requests [a]): TimeSlicing/Long"},
		},
		"later claim config beats earlier, request-specific or not": {
			configs: configs{claimCfg(gpuTSLong, "a"), claimCfg(gpuMPS)},
			results: results{result("a=gpu-0")},
			want:    []string{"gpu-0: claim config #1 (all requests): MPS/50%"},
		},
		"whole-object replacement, no merging": {
			configs: configs{class(gpuMPS, "a"), claimCfg(gpuExcl, "a")},
			results: results{result("a=gpu-0")},
			want:    []string{"gpu-0: claim config #0 (requests [a]): exclusive"},
		},
		"request filter": {
			configs: configs{claimCfg(gpuTSLong, "a"), claimCfg(gpuMPS, "b", "c")},
			results: results{result("a=gpu-0"), result("b=gpu-1"), result("c=gpu-2"), result("d=gpu-3")},
			want: []string{
				"gpu-0: claim config #0 (requests [a]): TimeSlicing/Long",
				"gpu-1: claim config #1 (requests [b c]): MPS/50%",
				"gpu-2: claim config #1 (requests [b c]): MPS/50%",
				"gpu-3: default config: exclusive",
			},
		},
		"subrequests: parent and full name both apply": {
			configs: configs{claimCfg(gpuTSLong, "a"), claimCfg(gpuMPS, "b/big")},
			results: results{result("a/big=gpu-0"), result("b/big=gpu-1"), result("b/small=gpu-2")},
			want: []string{
				"gpu-0: claim config #0 (requests [a]): TimeSlicing/Long",
				"gpu-1: claim config #1 (requests [b/big]): MPS/50%",
				"gpu-2: default config: exclusive",
			},
		},
		"other drivers' configs and results are ignored, even invalid ones": {
			configs: configs{claimCfg(gpuTS), otherDriver(claimCfg(notJSONDoc)), otherDriver(claimCfg(migMPS, "a"))},
			results: results{
				result("a=gpu-0"),
				{Request: "a", Driver: "nic.example.com", Pool: "p", Device: "nic-0"},
			},
			want: []string{"gpu-0: claim config #0 (all requests): TimeSlicing/Default"},
		},
		"config indexes count other drivers' configs, per source": {
			configs: configs{otherDriver(class(gpuTS)), class(gpuTSLong), otherDriver(claimCfg(gpuTS)), claimCfg(gpuMPS, "b")},
			results: results{result("a=gpu-0"), result("b=gpu-1")},
			want: []string{
				"gpu-0: class config #1 (all requests): TimeSlicing/Long",
				"gpu-1: claim config #1 (requests [b]): MPS/50%",
			},
		},
		"configs for all requests apply only to devices they fit": {
			configs: configs{claimCfg(migMPS), claimCfg(gpuTS)},
			results: results{result("a=gpu-0"), result("a=gpu-1-mig-3g.40gb-0-0")},
			want: []string{
				"gpu-0: claim config #1 (all requests): TimeSlicing/Default",
				"gpu-1-mig-3g.40gb-0-0: claim config #0 (all requests): mig MPS",
			},
		},
		"a misfit naming only other requests is no error": {
			configs: configs{claimCfg(migTS, "mig"), claimCfg(gpuTS, "gpu")},
			results: results{result("gpu=gpu-0")},
			want:    []string{"gpu-0: claim config #1 (requests [gpu]): TimeSlicing/Default"},
		},
		"a misfit overridden by a later config is no error, as in NVIDIA's driver": {
			configs: configs{claimCfg(migTS, "a"), claimCfg(gpuTS, "a")},
			results: results{result("a=gpu-0")},
			want:    []string{"gpu-0: claim config #1 (requests [a]): TimeSlicing/Default"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			devices, err := Resolve(driver, newClaim(tc.configs, tc.results...), kindOf, allFeatures)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			got := summary(devices)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("Resolve =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			for _, d := range devices {
				if err := d.Config.Validate(allFeatures); err != nil {
					t.Errorf("device %s got an invalid config: %v", d.Result.Device, err)
				}
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	type (
		configs = []resourceapi.DeviceAllocationConfiguration
		results = []resourceapi.DeviceRequestAllocationResult
	)
	doc := func(kind, body string) string {
		return `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "` + kind + `", ` + body + `}`
	}
	tests := map[string]struct {
		configs  configs
		results  results
		features *v1beta1.Features // allFeatures when nil
		want     string
	}{
		"unknown field, nested": {
			configs: configs{claimCfg(doc("GpuConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}`), "gpu")},
			want:    `claim config #0 (requests [gpu]): unknown field "sharing.timeSlicingConfig.intervall"`,
		},
		"wrong type": {
			configs: configs{class(doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}`))},
			want:    `class config #0 (all requests): sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got string`,
		},
		"missing kind": {
			configs: configs{claimCfg(`{"apiVersion": "resource.nvidia.com/v1beta1"}`)},
			want:    `claim config #0 (all requests): kind: Required value: supported kinds in resource.nvidia.com/v1beta1: "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"`,
		},
		"unknown kind": {
			configs: configs{claimCfg(`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain"}`)},
			want:    `claim config #0 (all requests): kind: Unsupported value: "ComputeDomain": supported kinds in resource.nvidia.com/v1beta1: "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"`,
		},
		"channel config for the GPU driver": {
			configs: configs{claimCfg(`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "d"}`)},
			want:    `claim config #0 (all requests): a ComputeDomainChannelConfig configures IMEX channels only, and this claim has none: device "gpu-0" (request "gpu") is a full GPU; use a GpuConfig`,
		},
		"bad apiVersion": {
			configs: configs{claimCfg(`{"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}`)},
			want:    `claim config #0 (all requests): apiVersion: Unsupported value: "resource.nvidia.com/v1": supported values: "resource.nvidia.com/v1beta1"`,
		},
		"duplicate field": {
			configs: configs{claimCfg(doc("GpuConfig", `"sharing": {"strategy": "MPS"}, "sharing": {"strategy": "TimeSlicing"}`))},
			want:    `claim config #0 (all requests): duplicate field "sharing"`,
		},
		"not JSON": {
			configs: configs{claimCfg(notJSONDoc, "gpu")},
			want:    `claim config #0 (requests [gpu]): invalid JSON at offset 15: unexpected end of JSON input`,
		},
		"unsupported strategy": {
			configs: configs{claimCfg(gpuTS), claimCfg(doc("GpuConfig", `"sharing": {"strategy": "Foo"}`), "gpu")},
			want:    `claim config #1 (requests [gpu]): sharing.strategy: Unsupported value: "Foo": supported values: "MPS", "TimeSlicing"`,
		},
		"invalid interval": {
			configs: configs{class(doc("GpuConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}`), "gpu")},
			want:    `class config #0 (requests [gpu]): sharing.timeSlicingConfig.interval: Unsupported value: "Forever": supported values: "Default", "Short", "Medium", "Long"`,
		},
		"invalid MPS settings": {
			configs: configs{claimCfg(doc("MigDeviceConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150, "defaultPinnedDeviceMemoryLimit": "512Ki"}}`))},
			want: `claim config #0 (all requests): [sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 150: must be from 1 to 100: the MPS daemon takes 1 to 100, and 0 would leave the clients no threads, ` +
				`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "512Ki": must be a whole number of MiB (a multiple of 1Mi, 1048576 bytes) from 1Mi to 8796093022207Mi]`,
		},
		"strategy behind a disabled feature gate": {
			configs:  configs{claimCfg(gpuMPS, "gpu")},
			features: &v1beta1.Features{TimeSlicingSettings: true},
			want:     `claim config #0 (requests [gpu]): sharing.strategy: Forbidden: strategy "MPS" requires the MPSSupport feature gate, which is disabled`,
		},
		"invalid config overridden later is still an error": {
			configs: configs{class(doc("GpuConfig", `"sharing": {"strategy": "Foo"}`), "gpu"), claimCfg(gpuTS, "gpu")},
			want:    `class config #0 (requests [gpu]): sharing.strategy: Unsupported value: "Foo": supported values: "MPS", "TimeSlicing"`,
		},
		"every config's problem at once": {
			configs: configs{claimCfg(doc("GpuConfig", `"x": 1`)), claimCfg(doc("GpuConfig", `"y": 2`), "gpu")},
			want:    `[claim config #0 (all requests): unknown field "x", claim config #1 (requests [gpu]): unknown field "y"]`,
		},
		"MigDeviceConfig on a full GPU": {
			configs: configs{claimCfg(migMPS, "gpu")},
			results: results{result("gpu=gpu-0")},
			want:    `claim config #0 (requests [gpu]): a MigDeviceConfig cannot configure device "gpu-0" (request "gpu"), which is a full GPU; use a GpuConfig`,
		},
		"GpuConfig on a MIG device, via the parent request": {
			configs: configs{class(gpuTS, "mig")},
			results: results{result("mig/small=gpu-0-mig-1g.10gb-0-0")},
			want:    `class config #0 (requests [mig]): a GpuConfig cannot configure device "gpu-0-mig-1g.10gb-0-0" (request "mig/small"), which is a MIG device; use a MigDeviceConfig`,
		},
		"MigDeviceConfig for all requests, and the claim got a full GPU": {
			configs: configs{claimCfg(migMPS)},
			results: results{result("gpu=gpu-0")},
			want:    `claim config #0 (all requests): a MigDeviceConfig configures MIG devices only, and this claim has none: device "gpu-0" (request "gpu") is a full GPU; use a GpuConfig`,
		},
		"class config for all requests that fits no device": {
			configs: configs{class(gpuTS)},
			results: results{result("a=gpu-0-mig-1g.10gb-0-0"), result("b=gpu-vfio-1")},
			want: `class config #0 (all requests): a GpuConfig configures full GPUs only, and this claim has none: ` +
				`device "gpu-0-mig-1g.10gb-0-0" (request "a") is a MIG device, device "gpu-vfio-1" (request "b") is a VFIO passthrough GPU; use a MigDeviceConfig or a VfioDeviceConfig`,
		},
		"non-opaque config": {
			configs: configs{{Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"}}},
			want:    `claim config #0 (requests [gpu]): only opaque parameters are supported`,
		},
		"unknown source": {
			configs: configs{cfg("FromElsewhere", gpuTS)},
			want:    `"FromElsewhere" config #0 (all requests): unknown config source "FromElsewhere"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			features := allFeatures
			if tc.features != nil {
				features = *tc.features
			}
			results := tc.results
			if results == nil {
				results = []resourceapi.DeviceRequestAllocationResult{result("gpu=gpu-0")}
			}
			devices, err := Resolve(driver, newClaim(tc.configs, results...), kindOf, features)
			if err == nil {
				t.Fatalf("Resolve = %v, want error %s", summary(devices), tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("Resolve error\n got %s\nwant %s", err, tc.want)
			}
			var configErr *ConfigError
			if !errors.As(err, &configErr) {
				t.Errorf("error %v holds no *ConfigError", err)
			}
		})
	}
}

func TestResolveOtherErrors(t *testing.T) {
	unallocated := &resourceapi.ResourceClaim{}
	unallocated.Namespace, unallocated.Name = "ns", "c"
	if _, err := Resolve(driver, unallocated, kindOf, allFeatures); err == nil || err.Error() != "claim ns/c is not allocated" {
		t.Errorf("Resolve of an unallocated claim = %v", err)
	}

	claim := newClaim(nil, result("gpu=gpu-0"), result("gpu=nic-7"))
	_, err := Resolve(driver, claim, kindOf, allFeatures)
	if want := `device "nic-7" (request "gpu"): no such device`; err == nil || err.Error() != want {
		t.Errorf("Resolve with an unknown device = %v, want %s", err, want)
	}
	var configErr *ConfigError
	if errors.As(err, &configErr) {
		t.Errorf("a device lookup failure is reported as a config error: %v", err)
	}

	imex := func(resourceapi.DeviceRequestAllocationResult) (DeviceKind, error) { return "imex-channel", nil }
	_, err = Resolve(driver, newClaim(nil, result("gpu=gpu-0")), imex, allFeatures)
	if want := `device "gpu-0" (request "gpu"): unsupported device kind "imex-channel"`; err == nil || err.Error() != want {
		t.Errorf("Resolve with an unsupported kind = %v, want %s", err, want)
	}
}

// The allocator empties the request list of a config that names every
// request of the claim; the spec still has it, and a config written for a
// request is held to fit its device.
func TestResolveTakesTheClaimsConfigsFromItsSpec(t *testing.T) {
	specConfig := func(doc string, requests ...string) resourceapi.DeviceClaimConfiguration {
		c := claimCfg(doc, requests...)
		return resourceapi.DeviceClaimConfiguration{Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration}
	}
	tests := map[string]struct {
		spec      []resourceapi.DeviceClaimConfiguration
		allocated []resourceapi.DeviceAllocationConfiguration
		results   []resourceapi.DeviceRequestAllocationResult
		want      string
	}{
		"a MigDeviceConfig for the one request, which got a full GPU": {
			spec:      []resourceapi.DeviceClaimConfiguration{specConfig(migMPS, "gpu")},
			allocated: []resourceapi.DeviceAllocationConfiguration{claimCfg(migMPS)},
			results:   []resourceapi.DeviceRequestAllocationResult{result("gpu=gpu-0")},
			want:      `claim config #0 (requests [gpu]): a MigDeviceConfig cannot configure device "gpu-0" (request "gpu"), which is a full GPU; use a GpuConfig`,
		},
		"a MigDeviceConfig for both requests, one of which got a full GPU": {
			spec:      []resourceapi.DeviceClaimConfiguration{specConfig(gpuTS, "gpu"), specConfig(migMPS, "gpu", "mig")},
			allocated: []resourceapi.DeviceAllocationConfiguration{claimCfg(gpuTS, "gpu"), claimCfg(migMPS)},
			results:   []resourceapi.DeviceRequestAllocationResult{result("gpu=gpu-0"), result("mig=gpu-1-mig-1g.10gb-0-0")},
			want:      `claim config #1 (requests [gpu mig]): a MigDeviceConfig cannot configure device "gpu-0" (request "gpu"), which is a full GPU; use a GpuConfig`,
		},
		"a config for a subrequest not chosen keeps its index in the spec": {
			spec:      []resourceapi.DeviceClaimConfiguration{specConfig(migMPS, "gpu/mig"), specConfig(migTS)},
			allocated: []resourceapi.DeviceAllocationConfiguration{claimCfg(migTS)},
			results:   []resourceapi.DeviceRequestAllocationResult{result("gpu/full=gpu-0")},
			want:      `claim config #1 (all requests): a MigDeviceConfig configures MIG devices only, and this claim has none: device "gpu-0" (request "gpu/full") is a full GPU; use a GpuConfig`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			claim := newClaim(tc.allocated, tc.results...)
			claim.Spec.Devices.Config = tc.spec
			devices, err := Resolve(driver, claim, kindOf, allFeatures)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Resolve = %v, %v\nwant error %s", summary(devices), err, tc.want)
			}
		})
	}
}

func TestGroups(t *testing.T) {
	claim := newClaim(
		[]resourceapi.DeviceAllocationConfiguration{claimCfg(gpuMPS, "mps"), claimCfg(migTS, "mig")},
		result("mps=gpu-0"), result("plain=gpu-1"), result("mps=gpu-2"),
		result("mig=gpu-3-mig-1g.10gb-0-0"), result("plain=gpu-4"), result("mig2=gpu-3-mig-1g.10gb-1-1"),
	)
	devices, err := Resolve(driver, claim, kindOf, allFeatures)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	var got []string
	for _, g := range Groups(devices) {
		var names []string
		for _, d := range g.Devices {
			names = append(names, d.Result.Device)
			if d.Config != g.Config || d.Origin.String() != g.Origin.String() {
				t.Errorf("device %s in group %s has config %p from %s", d.Result.Device, g.Origin, d.Config, d.Origin)
			}
		}
		got = append(got, fmt.Sprintf("%s %s: %s", g.Origin, g.Config.GetObjectKind().GroupVersionKind().Kind, strings.Join(names, " ")))
	}
	want := []string{
		"claim config #0 (requests [mps]) GpuConfig: gpu-0 gpu-2",
		"default config GpuConfig: gpu-1 gpu-4",
		"claim config #1 (requests [mig]) MigDeviceConfig: gpu-3-mig-1g.10gb-0-0",
		"default config MigDeviceConfig: gpu-3-mig-1g.10gb-1-1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Groups =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestParametersAsObject(t *testing.T) {
	c := claimCfg("", "gpu")
	c.Opaque.Parameters = runtime.RawExtension{Object: &v1beta1.GpuConfig{
		TypeMeta: v1beta1.DefaultGpuConfig().TypeMeta,
		Sharing:  &v1beta1.GpuSharing{Strategy: v1beta1.TimeSlicingStrategy, TimeSlicingConfig: &v1beta1.TimeSlicingConfig{Interval: ptr.To(v1beta1.ShortTimeSlice)}},
	}}
	devices, err := Resolve(driver, newClaim([]resourceapi.DeviceAllocationConfiguration{c}, result("gpu=gpu-0")), kindOf, allFeatures)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got, want := summary(devices)[0], "gpu-0: claim config #0 (requests [gpu]): TimeSlicing/Short"; got != want {
		t.Errorf("Resolve = %s, want %s", got, want)
	}
}
