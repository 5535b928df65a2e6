package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MigDeviceConfig configures a MIG device.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type MigDeviceConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Sharing selects how containers share the MIG device; nil means
	// exclusive use.
	Sharing *MigDeviceSharing `json:"sharing,omitempty"`
}

// DefaultMigDeviceConfig returns the config of a MIG device that no config
// applies to: exclusive use, no sharing.
func DefaultMigDeviceConfig() *MigDeviceConfig {
	return &MigDeviceConfig{TypeMeta: typeMeta(MigDeviceConfigKind)}
}

// Normalize fills in what the sharing strategy implies: an empty mpsConfig
// for MPS.
func (c *MigDeviceConfig) Normalize() {
	if c.Sharing.IsMps() && c.Sharing.MpsConfig == nil {
		c.Sharing.MpsConfig = &MpsConfig{}
	}
}

// Validate checks c against what the caller serves, f.
//
// Unlike on a GpuConfig, an mpsConfig next to strategy TimeSlicing is
// accepted and ignored, because the NVIDIA driver accepts and ignores it and
// manifests written for it must keep working.
func (c *MigDeviceConfig) Validate(f Features) error {
	if c.Sharing == nil {
		return nil
	}
	path := field.NewPath("sharing")
	errs, ok := validateStrategy(c.Sharing.Strategy, path.Child("strategy"), f)
	if ok && c.Sharing.Strategy == MpsStrategy {
		errs = append(errs, validateMpsConfig(c.Sharing.MpsConfig, path.Child("mpsConfig"))...)
	}
	return errs.ToAggregate()
}
