package v1beta1

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// doc builds a parameters document of kind with the given body members.
func doc(kind, body string) string {
	s := `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "` + kind + `"`
	if body != "" {
		s += ", " + body
	}
	return s + "}"
}

func TestDecode(t *testing.T) {
	gpu := func(s *GpuSharing) *GpuConfig { return &GpuConfig{TypeMeta: typeMeta(GpuConfigKind), Sharing: s} }
	mig := func(s *MigDeviceSharing) *MigDeviceConfig {
		return &MigDeviceConfig{TypeMeta: typeMeta(MigDeviceConfigKind), Sharing: s}
	}
	vfio := func(c *IOMMUConfig) *VfioDeviceConfig {
		return &VfioDeviceConfig{TypeMeta: typeMeta(VfioDeviceConfigKind), IOMMU: c}
	}
	tests := map[string]struct {
		in   string
		want runtime.Object
	}{
		"vfio, defaults": {
			in:   doc("VfioDeviceConfig", ""),
			want: vfio(nil),
		},
		"vfio, every field": {
			in:   doc("VfioDeviceConfig", `"iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": false}`),
			want: vfio(&IOMMUConfig{BackendPolicy: PreferIOMMUFDBackend, EnableAPIDevice: ptr.To(false)}),
		},
		"vfio, API device only": {
			in:   doc("VfioDeviceConfig", `"iommu": {"enableAPIDevice": true}`),
			want: vfio(&IOMMUConfig{EnableAPIDevice: ptr.To(true)}),
		},
		"vfio, unknown policy decodes; validation rejects it": {
			in:   doc("VfioDeviceConfig", `"iommu": {"backendPolicy": "IommuFDOnly"}`),
			want: vfio(&IOMMUConfig{BackendPolicy: "IommuFDOnly"}),
		},
		"gpu, exclusive": {
			in:   doc("GpuConfig", ""),
			want: gpu(nil),
		},
		"gpu, sharing null": {
			in:   doc("GpuConfig", `"sharing": null`),
			want: gpu(nil),
		},
		"gpu, time-slicing long": {
			in: doc("GpuConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}`),
			want: gpu(&GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr.To(LongTimeSlice)}}),
		},
		"gpu, MPS with every field": {
			in: doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {
				"defaultActiveThreadPercentage": 50,
				"defaultPinnedDeviceMemoryLimit": "10Gi",
				"defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-8f1e2d3c": 1048576}}}`),
			want: gpu(&GpuSharing{Strategy: MpsStrategy, MpsConfig: &MpsConfig{
				DefaultActiveThreadPercentage:  ptr.To(50),
				DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("10Gi")),
				DefaultPerDevicePinnedMemoryLimit: MpsPerDevicePinnedMemoryLimit{
					"0":            resource.MustParse("5Gi"),
					"GPU-8f1e2d3c": resource.MustParse("1Mi"),
				},
			}}),
		},
		"mig, MPS": {
			in: doc("MigDeviceConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}}`),
			want: mig(&MigDeviceSharing{Strategy: MpsStrategy,
				MpsConfig: &MpsConfig{DefaultActiveThreadPercentage: ptr.To(10)}}),
		},
		"mig, time-slicing": {
			in:   doc("MigDeviceConfig", `"sharing": {"strategy": "TimeSlicing"}`),
			want: mig(&MigDeviceSharing{Strategy: TimeSlicingStrategy}),
		},
		"unknown values decode; validation rejects them": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "Fabric"}`),
			want: gpu(&GpuSharing{Strategy: "Fabric"}),
		},
		"surrounding whitespace": {
			in:   "\n  " + doc("GpuConfig", "") + "\n",
			want: gpu(nil),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Decode([]byte(tc.in))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("Decode =\n%#v\nwant\n%#v", got, tc.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := map[string]struct {
		in   string
		want string
	}{
		"empty": {
			in:   "  ",
			want: `no parameters: expected a JSON object with apiVersion and kind`,
		},
		"not JSON": {
			in:   `{"apiVersion": `,
			want: `invalid JSON at offset 15: unexpected end of JSON input`,
		},
		"YAML is not accepted": {
			in:   "apiVersion: resource.nvidia.com/v1beta1\nkind: GpuConfig\n",
			want: `invalid JSON at offset 1: invalid character 'a' looking for beginning of value`,
		},
		"trailing data": {
			in:   doc("GpuConfig", "") + " {}",
			want: `invalid JSON at offset 68: invalid character '{' after top-level value`,
		},
		"not an object": {
			in:   `["GpuConfig"]`,
			want: `expected a JSON object with apiVersion and kind, got array`,
		},
		"missing apiVersion and kind": {
			in:   `{}`,
			want: `[apiVersion: Required value: must be "resource.nvidia.com/v1beta1", kind: Required value: supported kinds in resource.nvidia.com/v1beta1: "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"]`,
		},
		"missing kind": {
			in:   `{"apiVersion": "resource.nvidia.com/v1beta1"}`,
			want: `kind: Required value: supported kinds in resource.nvidia.com/v1beta1: "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"`,
		},
		"custom resource kinds are not parameters": {
			in:   doc("ComputeDomain", `"spec": {}`),
			want: `kind: Unsupported value: "ComputeDomain": supported kinds in resource.nvidia.com/v1beta1: "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"`,
		},
		"channel config, unknown field": {
			in:   doc("ComputeDomainChannelConfig", `"domainID": "d1", "domainId": "d2"`),
			want: `unknown field "domainId"`,
		},
		"channel config, domainID of the wrong type": {
			in:   doc("ComputeDomainChannelConfig", `"domainID": 7`),
			want: `domainID: expected string, got number 7`,
		},
		"channel config, allocationMode of the wrong type": {
			in:   doc("ComputeDomainChannelConfig", `"domainID": "d1", "allocationMode": ["All"]`),
			want: `allocationMode: expected string, got array`,
		},
		"daemon config has no allocationMode": {
			in:   doc("ComputeDomainDaemonConfig", `"domainID": "d1", "allocationMode": "All"`),
			want: `unknown field "allocationMode"`,
		},
		"kind is case-sensitive": {
			in:   doc("gpuConfig", ""),
			want: `kind: Unsupported value: "gpuConfig": supported kinds in resource.nvidia.com/v1beta1: "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"`,
		},
		"other version": {
			in:   `{"apiVersion": "resource.nvidia.com/v1alpha1", "kind": "GpuConfig"}`,
			want: `apiVersion: Unsupported value: "resource.nvidia.com/v1alpha1": supported values: "resource.nvidia.com/v1beta1"`,
		},
		"other group": {
			in:   `{"apiVersion": "gpu.resource.nvidia.com/v1beta1", "kind": "GpuConfig"}`,
			want: `apiVersion: Unsupported value: "gpu.resource.nvidia.com/v1beta1": supported values: "resource.nvidia.com/v1beta1"`,
		},
		"apiVersion not a string": {
			in:   `{"apiVersion": 1, "kind": "GpuConfig"}`,
			want: `apiVersion: expected string, got number 1`,
		},
		"unknown field, nested": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}`),
			want: `unknown field "sharing.timeSlicingConfig.intervall"`,
		},
		"unknown field, top level": {
			in:   doc("GpuConfig", `"metadata": {}`),
			want: `unknown field "metadata"`,
		},
		"field names are case-sensitive": {
			in:   doc("GpuConfig", `"Sharing": {"strategy": "MPS"}`),
			want: `unknown field "Sharing"`,
		},
		"timeSlicingConfig on a MIG device": {
			in:   doc("MigDeviceConfig", `"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}`),
			want: `unknown field "sharing.timeSlicingConfig"`,
		},
		"duplicate field": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "strategy": "TimeSlicing"}`),
			want: `duplicate field "sharing.strategy"`,
		},
		"duplicate kind": {
			in:   doc("GpuConfig", `"kind": "GpuConfig"`),
			want: `duplicate field "kind"`,
		},
		"duplicate map key": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "0": "2Gi"}}}`),
			want: `duplicate field "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]"`,
		},
		"bool given as string": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": "true"}}`),
			want: `sharing.mpsConfig.multiUser: expected boolean, got string`,
		},
		"int given as string": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}`),
			want: `sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got string`,
		},
		"int given as fraction": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50.5}}`),
			want: `sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got number 50.5`,
		},
		"int overflows": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 99999999999999999999}}`),
			want: `sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got number 99999999999999999999`,
		},
		"object given as string": {
			in:   doc("GpuConfig", `"sharing": "MPS"`),
			want: `sharing: expected object, got string`,
		},
		"string given as array": {
			in:   doc("GpuConfig", `"sharing": {"strategy": ["MPS"]}`),
			want: `sharing.strategy: expected string, got array`,
		},
		"bad quantity": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}`),
			want: `sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: invalid quantity "lots": expected a number with an optional suffix, such as "512Mi" or "2Gi"`,
		},
		"bad quantity in map": {
			in:   doc("GpuConfig", `"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"1": true}}}`),
			want: `sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: invalid quantity true: expected a number with an optional suffix, such as "512Mi" or "2Gi"`,
		},
		"vfio, unknown field": {
			in:   doc("VfioDeviceConfig", `"iommu": {"backendPolicy": "LegacyOnly", "backend": "LegacyOnly"}`),
			want: `unknown field "iommu.backend"`,
		},
		"vfio, field names are case-sensitive": {
			in:   doc("VfioDeviceConfig", `"iommu": {"BackendPolicy": "LegacyOnly"}`),
			want: `unknown field "iommu.BackendPolicy"`,
		},
		"vfio, bool given as string": {
			in:   doc("VfioDeviceConfig", `"iommu": {"enableAPIDevice": "true"}`),
			want: `iommu.enableAPIDevice: expected boolean, got string`,
		},
		"vfio, policy given as number, sharing on a VFIO device": {
			in:   doc("VfioDeviceConfig", `"iommu": {"backendPolicy": 1}, "sharing": {"strategy": "MPS"}`),
			want: `[iommu.backendPolicy: expected string, got number 1, unknown field "sharing"]`,
		},
		"vfio, duplicate field": {
			in:   doc("VfioDeviceConfig", `"iommu": {"enableAPIDevice": true, "enableAPIDevice": false}`),
			want: `duplicate field "iommu.enableAPIDevice"`,
		},
		"every problem at once": {
			in: doc("GpuConfig", `"sharing": {"strategy": 1, "mpsConfig": {"defaultActiveThreadPercentage": true}}, "shareing": {}`),
			want: `[sharing.strategy: expected string, got number 1, ` +
				`sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got boolean, ` +
				`unknown field "shareing"]`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Decode([]byte(tc.in))
			if err == nil {
				t.Fatalf("Decode = %#v, want error %q", got, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("Decode error\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestDecodeLenient(t *testing.T) {
	in := doc("GpuConfig", `"sharing": {"strategy": "MPS", "strategy": "TimeSlicing", "future": {"x": 1}}, "later": true`)
	got, err := DecodeLenient([]byte(in))
	if err != nil {
		t.Fatalf("DecodeLenient: %v", err)
	}
	want := &GpuConfig{TypeMeta: typeMeta(GpuConfigKind), Sharing: &GpuSharing{Strategy: TimeSlicingStrategy}}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("DecodeLenient = %#v, want %#v (last duplicate wins, unknown fields dropped)", got, want)
	}

	// Types still matter.
	_, err = DecodeLenient([]byte(doc("GpuConfig", `"sharing": {"strategy": 1}`)))
	if want := "sharing.strategy: expected string, got number 1"; err == nil || err.Error() != want {
		t.Errorf("DecodeLenient error = %v, want %s", err, want)
	}
	if _, err := Decode([]byte(in)); err == nil || !strings.Contains(err.Error(), `unknown field "later"`) {
		t.Errorf("Decode of the same document = %v, want it strict", err)
	}
}

func TestKinds(t *testing.T) {
	got := strings.Join(Kinds(), ",")
	if want := "ComputeDomainChannelConfig,ComputeDomainDaemonConfig,GpuConfig,MigDeviceConfig,VfioDeviceConfig"; got != want {
		t.Errorf("Kinds() = %s, want %s", got, want)
	}
	for _, kind := range Kinds() {
		obj, err := Decode([]byte(doc(kind, "")))
		if err != nil {
			t.Fatalf("Decode %s: %v", kind, err)
		}
		if _, ok := obj.(Config); !ok {
			t.Errorf("%s (%T) does not implement Config", kind, obj)
		}
		if gvk := obj.GetObjectKind().GroupVersionKind(); gvk != SchemeGroupVersion.WithKind(kind) {
			t.Errorf("decoded %s has GroupVersionKind %v", kind, gvk)
		}
	}
}

// TestNormalizedRoundTrip checks that a normalized config survives JSON
// unchanged, as configs stored in a checkpoint must.
func TestNormalizedRoundTrip(t *testing.T) {
	for _, in := range []string{
		doc("GpuConfig", `"sharing": {"strategy": "TimeSlicing"}`),
		doc("MigDeviceConfig", `"sharing": {"strategy": "MPS"}`),
		doc("VfioDeviceConfig", ""),
		doc("VfioDeviceConfig", `"iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": false}`),
		doc("VfioDeviceConfig", `"iommu": {"enableAPIDevice": false}`),
		doc("ComputeDomainChannelConfig", `"domainID": "d1"`),
		doc("ComputeDomainChannelConfig", `"domainID": "d1", "allocationMode": "All"`),
		doc("ComputeDomainDaemonConfig", `"domainID": "d1"`),
	} {
		obj, err := Decode([]byte(in))
		if err != nil {
			t.Fatalf("Decode %s: %v", in, err)
		}
		config := obj.(Config)
		config.Normalize()
		out, err := json.Marshal(config)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Decode(out)
		if err != nil {
			t.Fatalf("Decode of the normalized %s: %v", out, err)
		}
		again.(Config).Normalize()
		if !equality.Semantic.DeepEqual(again, config) {
			t.Errorf("%s normalized to %s, which decodes to %#v", in, out, again)
		}
	}
}
