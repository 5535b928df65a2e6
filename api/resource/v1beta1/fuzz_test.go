package v1beta1

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// FuzzDecodeMatchesAPIMachinery checks Decode against the API machinery's
// strict JSON serializer, the decoder the NVIDIA driver uses: both must
// accept the same documents and produce the same objects. Decode differs only
// in how much it says about a rejected document.
func FuzzDecodeMatchesAPIMachinery(f *testing.F) {
	reference := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{Strict: true})
	for _, seed := range []string{
		doc("GpuConfig", ""),
		doc("GpuConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}`),
		doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-1": 1e6}}}`),
		doc("MigDeviceConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {}}`),
		// Limits past int64 bytes: decoded like the API machinery does,
		// refused by Validate.
		doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 1e19, "defaultPerDevicePinnedMemoryLimit": {"0": "20E", "1": "9999Ei", "2": "9223372036854775808"}}}`),
		doc("MigDeviceConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}`),
		doc("VfioDeviceConfig", ""),
		doc("VfioDeviceConfig", `"iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": false}`),
		doc("VfioDeviceConfig", `"iommu": {"enableAPIDevice": true, "enableAPIDevice": null}`),
		doc("VfioDeviceConfig", `"iommu": {"backendPolicy": "LegacyOnly", "enableapidevice": true}`),
		doc("GpuConfig", `"sharing": {"strategy": "MPS", "strategy": "MPS"}`),
		doc("GpuConfig", `"Sharing": null, "sharing": {"mpsConfig": {"defaultActiveThreadPercentage": 5.0}}`),
		doc("Other", ""),
		`{"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}`,
		`{"kind": "GpuConfig"}`,
		`null`, `[]`, `{}`, `{"apiVersion": 1}`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := Decode(raw)
		want, wantErr := runtime.Decode(reference, raw)
		var missed *decoderError
		switch {
		case errors.As(err, &missed):
			t.Fatalf("the checker let through what the decoder rejects, %q: %v", raw, err)
		case err == nil && wantErr != nil:
			t.Fatalf("Decode accepts %q, which the API machinery rejects: %v", raw, wantErr)
		case err != nil && wantErr == nil:
			t.Fatalf("Decode rejects %q, which the API machinery accepts: %v", raw, err)
		case err == nil && !equality.Semantic.DeepEqual(got, want):
			t.Fatalf("Decode and the API machinery disagree on %q:\n%#v\n%#v", raw, got, want)
		}
	})
}
