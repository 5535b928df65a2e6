package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// GpuConfig configures a full GPU.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Sharing selects how containers share the GPU; nil means exclusive use.
	Sharing *GpuSharing `json:"sharing,omitempty"`
}

// DefaultGpuConfig returns the config of a GPU that no config applies to:
// exclusive use, no sharing.
func DefaultGpuConfig() *GpuConfig {
	return &GpuConfig{TypeMeta: typeMeta(GpuConfigKind)}
}

// Normalize fills in what the sharing strategy implies: interval Default for
// TimeSlicing, an empty mpsConfig for MPS.
func (c *GpuConfig) Normalize() {
	s := c.Sharing
	switch {
	case s.IsTimeSlicing():
		s.TimeSlicingConfig = normalizeTimeSlicing(s.TimeSlicingConfig)
	case s.IsMps() && s.MpsConfig == nil:
		s.MpsConfig = &MpsConfig{}
	}
}

// Validate checks c against what the caller serves, f.
func (c *GpuConfig) Validate(f Features) error {
	if c.Sharing == nil {
		return nil
	}
	path := field.NewPath("sharing")
	errs, ok := validateStrategy(c.Sharing.Strategy, path.Child("strategy"), f)
	if !ok {
		return errs.ToAggregate()
	}
	switch c.Sharing.Strategy {
	case TimeSlicingStrategy:
		errs = append(errs, validateTimeSlicingConfig(c.Sharing.TimeSlicingConfig, path.Child("timeSlicingConfig"))...)
		if c.Sharing.MpsConfig != nil {
			errs = append(errs, field.Forbidden(path.Child("mpsConfig"), `may only be set with strategy "MPS"`))
		}
	case MpsStrategy:
		errs = append(errs, validateMpsConfig(c.Sharing.MpsConfig, path.Child("mpsConfig"))...)
		if c.Sharing.TimeSlicingConfig != nil {
			errs = append(errs, field.Forbidden(path.Child("timeSlicingConfig"), `may only be set with strategy "TimeSlicing"`))
		}
	}
	return errs.ToAggregate()
}

func normalizeTimeSlicing(c *TimeSlicingConfig) *TimeSlicingConfig {
	if c == nil {
		c = &TimeSlicingConfig{}
	}
	if c.Interval == nil {
		interval := DefaultTimeSlice
		c.Interval = &interval
	}
	return c
}
