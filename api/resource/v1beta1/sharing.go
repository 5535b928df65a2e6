package v1beta1

import (
	"k8s.io/apimachinery/pkg/api/resource"
)

// SharingStrategy is how several containers share one device.
type SharingStrategy string

const (
	// TimeSlicingStrategy shares a device by CUDA time-slicing.
	TimeSlicingStrategy SharingStrategy = "TimeSlicing"
	// MpsStrategy shares a device through an MPS control daemon.
	MpsStrategy SharingStrategy = "MPS"
)

// SharingStrategies lists every strategy this API knows, sorted.
var SharingStrategies = []SharingStrategy{MpsStrategy, TimeSlicingStrategy}

// TimeSliceInterval is the length of a CUDA time slice.
type TimeSliceInterval string

const (
	// DefaultTimeSlice leaves the driver's default time slice in place.
	DefaultTimeSlice TimeSliceInterval = "Default"
	// ShortTimeSlice selects a short time slice.
	ShortTimeSlice TimeSliceInterval = "Short"
	// MediumTimeSlice selects a medium time slice.
	MediumTimeSlice TimeSliceInterval = "Medium"
	// LongTimeSlice selects a long time slice.
	LongTimeSlice TimeSliceInterval = "Long"
)

// TimeSliceIntervals lists every interval in the order of their nvidia-smi
// values: Default, Short, Medium, Long.
var TimeSliceIntervals = []TimeSliceInterval{DefaultTimeSlice, ShortTimeSlice, MediumTimeSlice, LongTimeSlice}

// Int returns the value nvidia-smi's compute-policy --set-timeslice takes
// for the interval (0 for Default up to 3 for Long), or -1 for an unknown
// interval.
func (t TimeSliceInterval) Int() int {
	for i, known := range TimeSliceIntervals {
		if t == known {
			return i
		}
	}
	return -1
}

// GpuSharing is the sharing setting of a full GPU.
type GpuSharing struct {
	// Strategy is TimeSlicing or MPS.
	Strategy SharingStrategy `json:"strategy"`
	// TimeSlicingConfig tunes TimeSlicing; only valid with that strategy.
	TimeSlicingConfig *TimeSlicingConfig `json:"timeSlicingConfig,omitempty"`
	// MpsConfig tunes MPS; only valid with that strategy.
	MpsConfig *MpsConfig `json:"mpsConfig,omitempty"`
}

// IsTimeSlicing reports whether s selects TimeSlicing; false for nil.
func (s *GpuSharing) IsTimeSlicing() bool { return s != nil && s.Strategy == TimeSlicingStrategy }

// IsMps reports whether s selects MPS; false for nil.
func (s *GpuSharing) IsMps() bool { return s != nil && s.Strategy == MpsStrategy }

// MigDeviceSharing is the sharing setting of a MIG device. Time slices of a
// MIG device cannot be tuned, so it has no timeSlicingConfig.
type MigDeviceSharing struct {
	// Strategy is TimeSlicing or MPS.
	Strategy SharingStrategy `json:"strategy"`
	// MpsConfig tunes MPS; only used with that strategy.
	MpsConfig *MpsConfig `json:"mpsConfig,omitempty"`
}

// IsTimeSlicing reports whether s selects TimeSlicing; false for nil.
func (s *MigDeviceSharing) IsTimeSlicing() bool {
	return s != nil && s.Strategy == TimeSlicingStrategy
}

// IsMps reports whether s selects MPS; false for nil.
func (s *MigDeviceSharing) IsMps() bool { return s != nil && s.Strategy == MpsStrategy }

// TimeSlicingConfig tunes CUDA time-slicing.
type TimeSlicingConfig struct {
	// Interval is the time slice; nil means Default.
	Interval *TimeSliceInterval `json:"interval,omitempty"`
}

// MpsConfig tunes the MPS control daemon of the devices a config applies to.
type MpsConfig struct {
	// DefaultActiveThreadPercentage caps the share of a device's threads
	// each client may use, 0 to 100.
	DefaultActiveThreadPercentage *int `json:"defaultActiveThreadPercentage,omitempty"`
	// DefaultPinnedDeviceMemoryLimit caps the device memory each client may
	// pin on every device; DefaultPerDevicePinnedMemoryLimit overrides it per
	// device.
	DefaultPinnedDeviceMemoryLimit *resource.Quantity `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
	// DefaultPerDevicePinnedMemoryLimit caps pinned device memory per device,
	// keyed by the device's index among the devices the config applies to
	// ("0", "1", ...) or by its UUID.
	DefaultPerDevicePinnedMemoryLimit MpsPerDevicePinnedMemoryLimit `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
	// MultiUser runs the MPS control daemon in multi-user mode (-M), so
	// that clients running under different user IDs share one MPS server
	// instead of waiting for each other's server to exit.
	MultiUser bool `json:"multiUser,omitempty"`
}

// MpsPerDevicePinnedMemoryLimit maps a device index or UUID to a pinned
// memory limit.
type MpsPerDevicePinnedMemoryLimit map[string]resource.Quantity
