package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// IOMMUBackendPolicy chooses the kernel interface a VFIO passthrough GPU is
// handed to the workload through.
type IOMMUBackendPolicy string

const (
	// LegacyOnlyIOMMUBackend uses the VFIO group interface: the container
	// gets /dev/vfio/<group> (and, with the API device, /dev/vfio/vfio).
	LegacyOnlyIOMMUBackend IOMMUBackendPolicy = "LegacyOnly"
	// PreferIOMMUFDBackend uses iommufd where the node has it: the container
	// gets /dev/vfio/devices/vfio<N> (and, with the API device, /dev/iommu);
	// on a node without iommufd it falls back to LegacyOnly.
	PreferIOMMUFDBackend IOMMUBackendPolicy = "PreferIommuFD"
)

// IOMMUBackendPolicies lists every policy this API knows, sorted.
var IOMMUBackendPolicies = []IOMMUBackendPolicy{LegacyOnlyIOMMUBackend, PreferIOMMUFDBackend}

// VfioDeviceConfig configures a GPU handed to a workload (usually a virtual
// machine) through VFIO passthrough.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type VfioDeviceConfig struct {
	metav1.TypeMeta `json:",inline"`
	// IOMMU chooses the device nodes the container gets; nil means the
	// defaults (LegacyOnly, with the API device).
	IOMMU *IOMMUConfig `json:"iommu,omitempty"`
}

// IOMMUConfig chooses how a VFIO device reaches the workload.
type IOMMUConfig struct {
	// BackendPolicy is LegacyOnly or PreferIommuFD; empty means LegacyOnly.
	BackendPolicy IOMMUBackendPolicy `json:"backendPolicy,omitempty"`
	// EnableAPIDevice adds the backend's API device (/dev/vfio/vfio for
	// LegacyOnly, /dev/iommu for iommufd) to the container; nil means true.
	// A VMM such as KubeVirt's needs it; set it to false for runtimes that
	// bring their own (Kata).
	EnableAPIDevice *bool `json:"enableAPIDevice,omitempty"`
}

// DefaultVfioDeviceConfig returns the config of a VFIO device that no
// config applies to: the legacy backend, with the API device.
func DefaultVfioDeviceConfig() *VfioDeviceConfig {
	c := &VfioDeviceConfig{TypeMeta: typeMeta(VfioDeviceConfigKind)}
	c.Normalize()
	return c
}

// PreferIOMMUFD reports whether c asks for iommufd; false for nil.
func (c *IOMMUConfig) PreferIOMMUFD() bool {
	return c != nil && c.BackendPolicy == PreferIOMMUFDBackend
}

// APIDevice reports whether c asks for the API device; true for nil, the
// default.
func (c *IOMMUConfig) APIDevice() bool {
	return c == nil || c.EnableAPIDevice == nil || *c.EnableAPIDevice
}

// Normalize fills in the defaults: an iommu section, backendPolicy
// LegacyOnly and enableAPIDevice true.
func (c *VfioDeviceConfig) Normalize() {
	if c.IOMMU == nil {
		c.IOMMU = &IOMMUConfig{}
	}
	if c.IOMMU.BackendPolicy == "" {
		c.IOMMU.BackendPolicy = LegacyOnlyIOMMUBackend
	}
	if c.IOMMU.EnableAPIDevice == nil {
		c.IOMMU.EnableAPIDevice = ptr.To(true)
	}
}

// Validate checks c. Passthrough needs no feature of f: whether a node
// offers VFIO devices at all is the device model's business, and a config
// only applies to devices that exist.
func (c *VfioDeviceConfig) Validate(_ Features) error {
	if c.IOMMU == nil {
		return nil
	}
	switch p := c.IOMMU.BackendPolicy; p {
	case "", LegacyOnlyIOMMUBackend, PreferIOMMUFDBackend:
		return nil
	default:
		return field.ErrorList{field.NotSupported(field.NewPath("iommu", "backendPolicy"), p, IOMMUBackendPolicies)}.ToAggregate()
	}
}
