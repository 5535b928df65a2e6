package v1beta1

import (
	"math/big"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

var allFeatures = Features{TimeSlicingSettings: true, MPSSupport: true}

func gpuSharing(s *GpuSharing) *GpuConfig {
	return &GpuConfig{TypeMeta: typeMeta(GpuConfigKind), Sharing: s}
}

func migSharing(s *MigDeviceSharing) *MigDeviceConfig {
	return &MigDeviceConfig{TypeMeta: typeMeta(MigDeviceConfigKind), Sharing: s}
}

func vfioIOMMU(c *IOMMUConfig) *VfioDeviceConfig {
	return &VfioDeviceConfig{TypeMeta: typeMeta(VfioDeviceConfigKind), IOMMU: c}
}

func TestDefaults(t *testing.T) {
	for _, c := range []Config{DefaultGpuConfig(), DefaultMigDeviceConfig(), DefaultVfioDeviceConfig()} {
		if err := c.Validate(Features{}); err != nil {
			t.Errorf("default %T is invalid without features: %v", c, err)
		}
		normalized := c.DeepCopyObject().(Config)
		normalized.Normalize()
		if !equality.Semantic.DeepEqual(normalized, c) {
			t.Errorf("default %T changes on Normalize: %#v", c, normalized)
		}
	}
	if s := DefaultGpuConfig().Sharing; s != nil {
		t.Errorf("DefaultGpuConfig shares the GPU (%+v); NVIDIA's default is exclusive", s)
	}
	if s := DefaultMigDeviceConfig().Sharing; s != nil {
		t.Errorf("DefaultMigDeviceConfig shares the device (%+v); NVIDIA's default is exclusive", s)
	}
	if got := DefaultGpuConfig().GetObjectKind().GroupVersionKind(); got != SchemeGroupVersion.WithKind(GpuConfigKind) {
		t.Errorf("DefaultGpuConfig kind = %v", got)
	}
	// NVIDIA's driver defaults to the legacy backend and, since PR #1481
	// (v0.6.0), to the API device, which KubeVirt needs.
	want := vfioIOMMU(&IOMMUConfig{BackendPolicy: LegacyOnlyIOMMUBackend, EnableAPIDevice: ptr.To(true)})
	if got := DefaultVfioDeviceConfig(); !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("DefaultVfioDeviceConfig = %#v, want %#v", got, want)
	}
}

func TestIOMMUConfigAccessors(t *testing.T) {
	tests := map[string]struct {
		in                    *IOMMUConfig
		preferIOMMUFD, apiDev bool
	}{
		"nil":                   {in: nil, apiDev: true},
		"empty":                 {in: &IOMMUConfig{}, apiDev: true},
		"iommufd, API device":   {in: &IOMMUConfig{BackendPolicy: PreferIOMMUFDBackend, EnableAPIDevice: ptr.To(true)}, preferIOMMUFD: true, apiDev: true},
		"legacy, no API device": {in: &IOMMUConfig{BackendPolicy: LegacyOnlyIOMMUBackend, EnableAPIDevice: ptr.To(false)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.in.PreferIOMMUFD(); got != tc.preferIOMMUFD {
				t.Errorf("PreferIOMMUFD() = %t, want %t", got, tc.preferIOMMUFD)
			}
			if got := tc.in.APIDevice(); got != tc.apiDev {
				t.Errorf("APIDevice() = %t, want %t", got, tc.apiDev)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	tests := map[string]struct {
		in, want Config
	}{
		"gpu exclusive stays exclusive": {
			in: gpuSharing(nil), want: gpuSharing(nil),
		},
		"gpu time-slicing gets interval Default": {
			in: gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy}),
			want: gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(DefaultTimeSlice)}}),
		},
		"gpu time-slicing config without interval": {
			in: gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{}}),
			want: gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(DefaultTimeSlice)}}),
		},
		"gpu time-slicing interval kept": {
			in: gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(ShortTimeSlice)}}),
			want: gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(ShortTimeSlice)}}),
		},
		"gpu MPS gets an empty mpsConfig": {
			in:   gpuSharing(&GpuSharing{Strategy: MpsStrategy}),
			want: gpuSharing(&GpuSharing{Strategy: MpsStrategy, MpsConfig: &MpsConfig{}}),
		},
		"gpu unknown strategy untouched": {
			in:   gpuSharing(&GpuSharing{Strategy: "Fabric"}),
			want: gpuSharing(&GpuSharing{Strategy: "Fabric"}),
		},
		"mig exclusive stays exclusive": {
			in: migSharing(nil), want: migSharing(nil),
		},
		"mig MPS gets an empty mpsConfig": {
			in:   migSharing(&MigDeviceSharing{Strategy: MpsStrategy}),
			want: migSharing(&MigDeviceSharing{Strategy: MpsStrategy, MpsConfig: &MpsConfig{}}),
		},
		"mig time-slicing untouched": {
			in:   migSharing(&MigDeviceSharing{Strategy: TimeSlicingStrategy}),
			want: migSharing(&MigDeviceSharing{Strategy: TimeSlicingStrategy}),
		},
		"vfio without iommu gets the defaults": {
			in:   vfioIOMMU(nil),
			want: vfioIOMMU(&IOMMUConfig{BackendPolicy: LegacyOnlyIOMMUBackend, EnableAPIDevice: ptr.To(true)}),
		},
		"vfio empty iommu gets the defaults": {
			in:   vfioIOMMU(&IOMMUConfig{}),
			want: vfioIOMMU(&IOMMUConfig{BackendPolicy: LegacyOnlyIOMMUBackend, EnableAPIDevice: ptr.To(true)}),
		},
		"vfio API device off is kept": {
			in:   vfioIOMMU(&IOMMUConfig{EnableAPIDevice: ptr.To(false)}),
			want: vfioIOMMU(&IOMMUConfig{BackendPolicy: LegacyOnlyIOMMUBackend, EnableAPIDevice: ptr.To(false)}),
		},
		"vfio iommufd gets the API device": {
			in:   vfioIOMMU(&IOMMUConfig{BackendPolicy: PreferIOMMUFDBackend}),
			want: vfioIOMMU(&IOMMUConfig{BackendPolicy: PreferIOMMUFDBackend, EnableAPIDevice: ptr.To(true)}),
		},
		"vfio unknown policy untouched": {
			in:   vfioIOMMU(&IOMMUConfig{BackendPolicy: "Other", EnableAPIDevice: ptr.To(false)}),
			want: vfioIOMMU(&IOMMUConfig{BackendPolicy: "Other", EnableAPIDevice: ptr.To(false)}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.in.Normalize()
			if !equality.Semantic.DeepEqual(tc.in, tc.want) {
				t.Errorf("Normalize =\n%#v\nwant\n%#v", tc.in, tc.want)
			}
			tc.in.Normalize()
			if !equality.Semantic.DeepEqual(tc.in, tc.want) {
				t.Errorf("Normalize is not idempotent: %#v", tc.in)
			}
		})
	}
}

// The allowed range of a pinned memory limit, as errors give it, and the
// note on a value the parser clamped.
const (
	pinnedRange = `must be a whole number of MiB (a multiple of 1Mi, 1048576 bytes) from 1Mi to 8796093022207Mi`
	clampNote   = ` (quantities of 8Ei and more are read as 9223372036854775807)`
	threadRange = `must be from 1 to 100: the MPS daemon takes 1 to 100, and 0 would leave the clients no threads`
)

func TestValidate(t *testing.T) {
	mps := func(c MpsConfig) *GpuConfig { return gpuSharing(&GpuSharing{Strategy: MpsStrategy, MpsConfig: &c}) }
	limits := func(kv ...string) MpsPerDevicePinnedMemoryLimit {
		m := MpsPerDevicePinnedMemoryLimit{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = resource.MustParse(kv[i+1])
		}
		return m
	}
	tests := map[string]struct {
		config   Config
		features Features
		want     string // "" for valid
	}{
		"gpu exclusive, no features": {config: gpuSharing(nil)},
		"gpu time-slicing": {
			config:   gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(MediumTimeSlice)}}),
			features: Features{TimeSlicingSettings: true},
		},
		"gpu time-slicing without config": {
			config:   gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy}),
			features: Features{TimeSlicingSettings: true},
		},
		"gpu MPS, every field": {
			config: mps(MpsConfig{
				DefaultActiveThreadPercentage:     ptr.To(100),
				DefaultPinnedDeviceMemoryLimit:    ptr.To(resource.MustParse("1Mi")),
				DefaultPerDevicePinnedMemoryLimit: limits("0", "2Gi", "GPU-0a1b", "1Gi", "MIG-7c2d", "1Gi"),
			}),
			features: Features{MPSSupport: true},
		},
		"strategy missing": {
			config:   gpuSharing(&GpuSharing{}),
			features: allFeatures,
			want:     `sharing.strategy: Required value: supported values: "MPS", "TimeSlicing"`,
		},
		"strategy unknown": {
			config:   gpuSharing(&GpuSharing{Strategy: "Foo"}),
			features: allFeatures,
			want:     `sharing.strategy: Unsupported value: "Foo": supported values: "MPS", "TimeSlicing"`,
		},
		"strategy is case-sensitive": {
			config:   gpuSharing(&GpuSharing{Strategy: "mps"}),
			features: allFeatures,
			want:     `sharing.strategy: Unsupported value: "mps": supported values: "MPS", "TimeSlicing"`,
		},
		"time-slicing feature off": {
			config:   gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy}),
			features: Features{MPSSupport: true},
			want:     `sharing.strategy: Forbidden: strategy "TimeSlicing" requires the TimeSlicingSettings feature gate, which is disabled`,
		},
		"MPS feature off": {
			config:   gpuSharing(&GpuSharing{Strategy: MpsStrategy}),
			features: Features{TimeSlicingSettings: true},
			want:     `sharing.strategy: Forbidden: strategy "MPS" requires the MPSSupport feature gate, which is disabled`,
		},
		"interval unknown": {
			config:   gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(TimeSliceInterval("Forever"))}}),
			features: allFeatures,
			want:     `sharing.timeSlicingConfig.interval: Unsupported value: "Forever": supported values: "Default", "Short", "Medium", "Long"`,
		},
		"mpsConfig with time-slicing": {
			config:   gpuSharing(&GpuSharing{Strategy: TimeSlicingStrategy, MpsConfig: &MpsConfig{}}),
			features: allFeatures,
			want:     `sharing.mpsConfig: Forbidden: may only be set with strategy "MPS"`,
		},
		"timeSlicingConfig with MPS": {
			config:   gpuSharing(&GpuSharing{Strategy: MpsStrategy, TimeSlicingConfig: &TimeSlicingConfig{}}),
			features: allFeatures,
			want:     `sharing.timeSlicingConfig: Forbidden: may only be set with strategy "TimeSlicing"`,
		},
		"thread percentage 0, which leaves no threads": {
			config:   mps(MpsConfig{DefaultActiveThreadPercentage: ptr.To(0)}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 0: ` + threadRange,
		},
		"thread percentage 1": {
			config:   mps(MpsConfig{DefaultActiveThreadPercentage: ptr.To(1)}),
			features: allFeatures,
		},
		"thread percentage 100": {
			config:   mps(MpsConfig{DefaultActiveThreadPercentage: ptr.To(100)}),
			features: allFeatures,
		},
		"thread percentage negative": {
			config:   mps(MpsConfig{DefaultActiveThreadPercentage: ptr.To(-1)}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: -1: ` + threadRange,
		},
		"thread percentage above 100": {
			config:   mps(MpsConfig{DefaultActiveThreadPercentage: ptr.To(101)}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 101: ` + threadRange,
		},
		"pinned memory below 1Mi": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("1M"))}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1M": ` + pinnedRange,
		},
		"pinned memory 1e19 overflows int64": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("1e19"))}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "10e18": ` + pinnedRange,
		},
		"pinned memory 2^63 overflows int64": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("9223372036854775808"))}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "9223372036854775808": ` + pinnedRange,
		},
		"pinned memory 9999Ei, clamped by the parser": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("9999Ei"))}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "9223372036854775807": ` + pinnedRange + clampNote,
		},
		"pinned memory 2^63-1, which clamped values equal": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("9223372036854775807"))}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "9223372036854775807": ` + pinnedRange + clampNote,
		},
		"pinned memory at the maximum": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("8796093022207Mi"))}),
			features: allFeatures,
		},
		"pinned memory past the last whole MiB below 2^63": {
			config:   mps(MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("9223372036854775806"))}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "9223372036854775806": ` + pinnedRange,
		},
		"pinned memory 7Ei and fractions of whole MiB": {
			config: mps(MpsConfig{
				DefaultPinnedDeviceMemoryLimit:    ptr.To(resource.MustParse("7Ei")),
				DefaultPerDevicePinnedMemoryLimit: limits("0", "1.5Gi", "1", "0.5Gi", "2", "1048576"),
			}),
			features: allFeatures,
		},
		"pinned memory no whole MiB, never rounded": {
			config: mps(MpsConfig{
				DefaultPinnedDeviceMemoryLimit:    ptr.To(resource.MustParse("1.5Mi")),
				DefaultPerDevicePinnedMemoryLimit: limits("0", "0.1Gi", "1", "1048576.5"),
			}),
			features: allFeatures,
			want: `[sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1536Ki": ` + pinnedRange + `, ` +
				`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: Invalid value: "107374182400m": ` + pinnedRange + `, ` +
				`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: Invalid value: "1048576500m": ` + pinnedRange + `]`,
		},
		"per-device pinned memory overflows, each named": {
			config:   mps(MpsConfig{DefaultPerDevicePinnedMemoryLimit: limits("0", "20E", "GPU-0a1b", "8Ei", "1", "2Gi")}),
			features: allFeatures,
			want: `[sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: Invalid value: "20E": ` + pinnedRange + `, ` +
				`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-0a1b]: Invalid value: "9223372036854775807": ` + pinnedRange + clampNote + `]`,
		},
		"mig MPS pinned memory overflows": {
			config: migSharing(&MigDeviceSharing{Strategy: MpsStrategy, MpsConfig: &MpsConfig{
				DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("1e19"))}}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "10e18": ` + pinnedRange,
		},
		"per-device index written twice": {
			config:   mps(MpsConfig{DefaultPerDevicePinnedMemoryLimit: limits("0", "1Gi", "00", "2Gi", "+1", "1Gi")}),
			features: allFeatures,
			want: `[sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[+1]: Invalid value: "+1": must be a device index (0, 1, ..., no sign or leading zero) or a device UUID (GPU-... or MIG-...), ` +
				`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[00]: Invalid value: "00": must be a device index (0, 1, ..., no sign or leading zero) or a device UUID (GPU-... or MIG-...)]`,
		},
		"per-device key neither index nor UUID": {
			config:   mps(MpsConfig{DefaultPerDevicePinnedMemoryLimit: limits("gpu0", "1Gi")}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[gpu0]: Invalid value: "gpu0": must be a device index (0, 1, ..., no sign or leading zero) or a device UUID (GPU-... or MIG-...)`,
		},
		"per-device negative index and low limit": {
			config:   mps(MpsConfig{DefaultPerDevicePinnedMemoryLimit: limits("-1", "1Gi", "1", "-5Gi")}),
			features: allFeatures,
			want: `[sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[-1]: Invalid value: "-1": must be a device index (0, 1, ..., no sign or leading zero) or a device UUID (GPU-... or MIG-...), ` +
				`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: Invalid value: "-5Gi": ` + pinnedRange + `]`,
		},
		"every problem at once, feature off": {
			config: gpuSharing(&GpuSharing{Strategy: MpsStrategy, TimeSlicingConfig: &TimeSlicingConfig{},
				MpsConfig: &MpsConfig{DefaultActiveThreadPercentage: ptr.To(200)}}),
			want: `[sharing.strategy: Forbidden: strategy "MPS" requires the MPSSupport feature gate, which is disabled, ` +
				`sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 200: ` + threadRange + `, ` +
				`sharing.timeSlicingConfig: Forbidden: may only be set with strategy "TimeSlicing"]`,
		},
		"mig exclusive, no features": {config: migSharing(nil)},
		"mig time-slicing": {
			config:   migSharing(&MigDeviceSharing{Strategy: TimeSlicingStrategy}),
			features: Features{TimeSlicingSettings: true},
		},
		"mig time-slicing ignores mpsConfig, as NVIDIA's driver does": {
			config:   migSharing(&MigDeviceSharing{Strategy: TimeSlicingStrategy, MpsConfig: &MpsConfig{DefaultActiveThreadPercentage: ptr.To(500)}}),
			features: Features{TimeSlicingSettings: true},
		},
		"mig strategy unknown": {
			config:   migSharing(&MigDeviceSharing{Strategy: "Fabric"}),
			features: allFeatures,
			want:     `sharing.strategy: Unsupported value: "Fabric": supported values: "MPS", "TimeSlicing"`,
		},
		"mig MPS feature off": {
			config: migSharing(&MigDeviceSharing{Strategy: MpsStrategy}),
			want:   `sharing.strategy: Forbidden: strategy "MPS" requires the MPSSupport feature gate, which is disabled`,
		},
		"vfio defaults, no features":       {config: vfioIOMMU(nil)},
		"vfio empty iommu, not normalized": {config: vfioIOMMU(&IOMMUConfig{})},
		"vfio legacy": {
			config: vfioIOMMU(&IOMMUConfig{BackendPolicy: LegacyOnlyIOMMUBackend, EnableAPIDevice: ptr.To(false)}),
		},
		"vfio iommufd": {
			config: vfioIOMMU(&IOMMUConfig{BackendPolicy: PreferIOMMUFDBackend, EnableAPIDevice: ptr.To(true)}),
		},
		"vfio policy unknown": {
			config:   vfioIOMMU(&IOMMUConfig{BackendPolicy: "IommuFDOnly"}),
			features: allFeatures,
			want:     `iommu.backendPolicy: Unsupported value: "IommuFDOnly": supported values: "LegacyOnly", "PreferIommuFD"`,
		},
		"vfio policy is case-sensitive": {
			config: vfioIOMMU(&IOMMUConfig{BackendPolicy: "PreferIOMMUFD"}),
			want:   `iommu.backendPolicy: Unsupported value: "PreferIOMMUFD": supported values: "LegacyOnly", "PreferIommuFD"`,
		},
		"mig MPS bad config": {
			config:   migSharing(&MigDeviceSharing{Strategy: MpsStrategy, MpsConfig: &MpsConfig{DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("0"))}}),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "0": ` + pinnedRange,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.config.Validate(tc.features)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate = %v, want valid", err)
			case tc.want != "" && err == nil:
				t.Errorf("Validate = nil, want %s", tc.want)
			case tc.want != "" && err.Error() != tc.want:
				t.Errorf("Validate\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestTimeSliceIntervalInt(t *testing.T) {
	for interval, want := range map[TimeSliceInterval]int{
		DefaultTimeSlice: 0, ShortTimeSlice: 1, MediumTimeSlice: 2, LongTimeSlice: 3, "Forever": -1, "": -1,
	} {
		if got := interval.Int(); got != want {
			t.Errorf("%q.Int() = %d, want %d", interval, got, want)
		}
	}
}

func TestDeepCopy(t *testing.T) {
	gpu := gpuSharing(&GpuSharing{
		Strategy:          MpsStrategy,
		TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(LongTimeSlice)},
		MpsConfig: &MpsConfig{
			DefaultActiveThreadPercentage:     ptr.To(20),
			DefaultPinnedDeviceMemoryLimit:    ptr.To(resource.MustParse("1Gi")),
			DefaultPerDevicePinnedMemoryLimit: MpsPerDevicePinnedMemoryLimit{"0": resource.MustParse("2Gi")},
			MultiUser:                         true,
		},
	})
	assertEveryFieldSet(t, reflect.ValueOf(gpu), "GpuConfig")
	cp := gpu.DeepCopyObject().(*GpuConfig)
	if !equality.Semantic.DeepEqual(cp, gpu) {
		t.Fatalf("copy differs: %#v", cp)
	}
	*cp.Sharing.TimeSlicingConfig.Interval = ShortTimeSlice
	*cp.Sharing.MpsConfig.DefaultActiveThreadPercentage = 30
	cp.Sharing.MpsConfig.DefaultPinnedDeviceMemoryLimit.Add(resource.MustParse("1Gi"))
	cp.Sharing.MpsConfig.DefaultPerDevicePinnedMemoryLimit["1"] = resource.MustParse("1Gi")
	cp.Sharing.Strategy = TimeSlicingStrategy
	cp.Kind = "changed"
	if *gpu.Sharing.TimeSlicingConfig.Interval != LongTimeSlice ||
		*gpu.Sharing.MpsConfig.DefaultActiveThreadPercentage != 20 ||
		gpu.Sharing.MpsConfig.DefaultPinnedDeviceMemoryLimit.String() != "1Gi" ||
		len(gpu.Sharing.MpsConfig.DefaultPerDevicePinnedMemoryLimit) != 1 ||
		gpu.Sharing.Strategy != MpsStrategy || gpu.Kind != GpuConfigKind {
		t.Errorf("changing the copy changed the original: %#v", gpu)
	}

	mig := migSharing(&MigDeviceSharing{Strategy: MpsStrategy, MpsConfig: &MpsConfig{
		DefaultActiveThreadPercentage:     ptr.To(5),
		DefaultPinnedDeviceMemoryLimit:    ptr.To(resource.MustParse("1Gi")),
		DefaultPerDevicePinnedMemoryLimit: MpsPerDevicePinnedMemoryLimit{"MIG-1": resource.MustParse("2Gi")},
		MultiUser:                         true,
	}})
	assertEveryFieldSet(t, reflect.ValueOf(mig), "MigDeviceConfig")
	mcp := mig.DeepCopyObject().(*MigDeviceConfig)
	if !equality.Semantic.DeepEqual(mcp, mig) {
		t.Fatalf("copy differs: %#v", mcp)
	}
	*mcp.Sharing.MpsConfig.DefaultActiveThreadPercentage = 6
	if *mig.Sharing.MpsConfig.DefaultActiveThreadPercentage != 5 {
		t.Errorf("changing the copy changed the original")
	}

	vfio := vfioIOMMU(&IOMMUConfig{BackendPolicy: PreferIOMMUFDBackend, EnableAPIDevice: ptr.To(true)})
	assertEveryFieldSet(t, reflect.ValueOf(vfio), "VfioDeviceConfig")
	vcp := vfio.DeepCopyObject().(*VfioDeviceConfig)
	if !equality.Semantic.DeepEqual(vcp, vfio) {
		t.Fatalf("copy differs: %#v", vcp)
	}
	*vcp.IOMMU.EnableAPIDevice = false
	vcp.IOMMU.BackendPolicy = LegacyOnlyIOMMUBackend
	if !*vfio.IOMMU.EnableAPIDevice || vfio.IOMMU.BackendPolicy != PreferIOMMUFDBackend {
		t.Errorf("changing the copy changed the original: %#v", vfio.IOMMU)
	}

	if (*GpuConfig)(nil).DeepCopyObject() != nil || (*MigDeviceConfig)(nil).DeepCopyObject() != nil ||
		(*VfioDeviceConfig)(nil).DeepCopyObject() != nil {
		t.Errorf("copy of a nil config is not nil")
	}
}

// assertEveryFieldSet fails for a zero field anywhere in v, so that a field
// added to a type cannot be left out of TestDeepCopy's fixtures, which
// check that the generated deep copies share nothing.
func assertEveryFieldSet(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			t.Errorf("fixture leaves %s unset", path)
			return
		}
		assertEveryFieldSet(t, v.Elem(), path)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[resource.Quantity]() {
			return
		}
		for i := range v.NumField() {
			assertEveryFieldSet(t, v.Field(i), path+"."+v.Type().Field(i).Name)
		}
	default:
		if v.IsZero() {
			t.Errorf("fixture leaves %s unset", path)
		}
	}
}

// TestPinnedMemoryLimitValue checks what the plugin relies on: every limit
// validation accepts becomes, through Quantity.Value, exactly the byte count
// it says, a whole number of MiB of at least 1 MiB, which the MPS daemon
// takes without rounding; every limit that would not is refused.
func TestPinnedMemoryLimitValue(t *testing.T) {
	tests := []struct {
		in    string
		valid bool
	}{
		{"1Mi", true},
		{"1.5Gi", true},
		{"1048576", true},
		{"10Gi", true},
		{"7Ei", true},
		{"8796093022207Mi", true},
		{"9223372036853727232", true},
		{"1.5Mi", false},
		{"1048577", false},
		{"1048576.5", false},
		{"0.1Gi", false},
		{"1M", false},
		{"9e18", false},
		{"9223372036854775806", false},
		{"9223372036854775807", false},
		{"9223372036854775808", false},
		{"8796093022208Mi", false},
		{"9.3e18", false},
		{"1e19", false},
		{"20E", false},
		{"8Ei", false},
		{"9999Ei", false},
		{"1048575", false},
		{"0", false},
		{"-1Gi", false},
		{"-9999Ei", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			q := resource.MustParse(tt.in)
			errs := validatePinnedMemoryLimit(q, field.NewPath("limit"))
			if valid := len(errs) == 0; valid != tt.valid {
				t.Fatalf("valid = %v (%v), want %v", valid, errs, tt.valid)
			}
			// The exact byte count, rounded up, in arbitrary precision.
			r, ok := new(big.Rat).SetString(q.AsDec().String())
			if !ok {
				t.Fatalf("cannot read %s as a number", q.AsDec())
			}
			exact := new(big.Int).Add(r.Num(), new(big.Int).Sub(r.Denom(), big.NewInt(1)))
			exact.Div(exact, r.Denom())
			if !tt.valid {
				if !strings.Contains(errs.ToAggregate().Error(), "limit: Invalid value") {
					t.Errorf("error %v does not name the field", errs)
				}
				return
			}
			if v := q.Value(); v < 1<<20 || v%(1<<20) != 0 || big.NewInt(v).Cmp(exact) != 0 {
				t.Errorf("Value() = %d, want %s, a whole number of MiB", v, exact)
			}
		})
	}
}
