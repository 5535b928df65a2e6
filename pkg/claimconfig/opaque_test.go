package claimconfig

import (
	"encoding/json"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

func opaque(driverName, doc string) *resourceapi.OpaqueDeviceConfiguration {
	return &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(doc)}}
}

func TestValidateOpaque(t *testing.T) {
	tests := map[string]struct {
		opaque   *resourceapi.OpaqueDeviceConfiguration
		features v1beta1.Features
		want     string // "" for valid
	}{
		"nil":                           {opaque: nil},
		"other driver, not even JSON":   {opaque: opaque("nic.example.com", notJSONDoc)},
		"valid GpuConfig":               {opaque: opaque(driver, gpuTSLong), features: allFeatures},
		"valid MigDeviceConfig":         {opaque: opaque(driver, migMPS), features: allFeatures},
		"exclusive, no features needed": {opaque: opaque(driver, gpuExcl)},
		"strategy behind a disabled gate": {
			opaque: opaque(driver, gpuTS),
			want:   `sharing.strategy: Forbidden: strategy "TimeSlicing" requires the TimeSlicingSettings feature gate, which is disabled`,
		},
		"decode error": {
			opaque:   opaque(driver, `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}}`),
			features: allFeatures,
			want:     `sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got string`,
		},
		"empty parameters": {
			opaque: opaque(driver, ""),
			want:   `no parameters: expected a JSON object with apiVersion and kind`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateOpaque(driver, tc.opaque, tc.features)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("ValidateOpaque = %v, want valid", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Errorf("ValidateOpaque\n got %v\nwant %s", err, tc.want)
			}
		})
	}
}

// fuzzSeeds are valid and invalid documents of both kinds; FuzzDecodeValidate
// starts from them.
var fuzzSeeds = []string{
	gpuTS, gpuTSLong, gpuMPS, gpuExcl, migMPS, migTS, notJSONDoc, "", "null", "[]", "{}",
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": null}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 100, "defaultPinnedDeviceMemoryLimit": "1Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "2Gi", "GPU-5d7c": 1e9}}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"MIG-1": "512Mi"}}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "strategy": "MPS"}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 1.5}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "-1"}}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "Gpuconfig"}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": false}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "Iommufd"}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": true}}}`,
	`{"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig", "Sharing": {}}`,
	`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}`,
}

// FuzzDecodeValidate checks that decoding and validating never panic, that
// every error has a message, and that an accepted config survives a round
// trip through JSON unchanged and still valid, with the webhook's entry
// point agreeing.
func FuzzDecodeValidate(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		lenient, lenientErr := v1beta1.DecodeLenient(raw)
		obj, err := v1beta1.Decode(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("Decode error without a message for %q", raw)
			}
			return
		}
		if lenientErr != nil {
			t.Fatalf("DecodeLenient rejects what Decode accepts, %q: %v", raw, lenientErr)
		}
		if !equality.Semantic.DeepEqual(lenient, obj) {
			t.Fatalf("DecodeLenient and Decode disagree on %q:\n%#v\n%#v", raw, lenient, obj)
		}
		config, ok := obj.(v1beta1.Config)
		if !ok {
			t.Fatalf("decoded %T is no Config", obj)
		}
		_ = config.Validate(v1beta1.Features{}) // must not panic before Normalize either
		config.Normalize()
		once := config.DeepCopyObject()
		config.Normalize()
		if !equality.Semantic.DeepEqual(once, config) {
			t.Fatalf("Normalize is not idempotent for %q", raw)
		}
		if err := config.Validate(allFeatures); err != nil {
			if err.Error() == "" {
				t.Fatalf("Validate error without a message for %q", raw)
			}
			return
		}

		if err := ValidateOpaque(driver, opaque(driver, string(raw)), allFeatures); err != nil {
			t.Fatalf("ValidateOpaque rejects an accepted config %q: %v", raw, err)
		}
		out, err := json.Marshal(config)
		if err != nil {
			t.Fatalf("marshal accepted config %q: %v", raw, err)
		}
		again, err := DecodeParameters(out, allFeatures)
		if err != nil {
			t.Fatalf("accepted config %q does not re-validate after a round trip as %s: %v", raw, out, err)
		}
		if !equality.Semantic.DeepEqual(again, config) {
			t.Fatalf("round trip of %q changed it:\n%#v\n%#v", raw, config, again)
		}
	})
}
