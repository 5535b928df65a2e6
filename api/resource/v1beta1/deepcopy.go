package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

// The deep copies are written by hand in deepcopy-gen's shape; a field added
// to a type must be added here too (TestDeepCopy fills every field and
// checks that nothing is shared).

// DeepCopyInto copies c into out, sharing nothing.
func (c *GpuConfig) DeepCopyInto(out *GpuConfig) {
	*out = *c
	out.TypeMeta = c.TypeMeta
	if c.Sharing != nil {
		out.Sharing = c.Sharing.DeepCopy()
	}
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *GpuConfig) DeepCopy() *GpuConfig {
	if c == nil {
		return nil
	}
	out := new(GpuConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *GpuConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *MigDeviceConfig) DeepCopyInto(out *MigDeviceConfig) {
	*out = *c
	out.TypeMeta = c.TypeMeta
	if c.Sharing != nil {
		out.Sharing = c.Sharing.DeepCopy()
	}
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *MigDeviceConfig) DeepCopy() *MigDeviceConfig {
	if c == nil {
		return nil
	}
	out := new(MigDeviceConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *MigDeviceConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies s into out, sharing nothing.
func (s *GpuSharing) DeepCopyInto(out *GpuSharing) {
	*out = *s
	out.TimeSlicingConfig = s.TimeSlicingConfig.DeepCopy()
	out.MpsConfig = s.MpsConfig.DeepCopy()
}

// DeepCopy returns a copy of s that shares nothing with it.
func (s *GpuSharing) DeepCopy() *GpuSharing {
	if s == nil {
		return nil
	}
	out := new(GpuSharing)
	s.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies s into out, sharing nothing.
func (s *MigDeviceSharing) DeepCopyInto(out *MigDeviceSharing) {
	*out = *s
	out.MpsConfig = s.MpsConfig.DeepCopy()
}

// DeepCopy returns a copy of s that shares nothing with it.
func (s *MigDeviceSharing) DeepCopy() *MigDeviceSharing {
	if s == nil {
		return nil
	}
	out := new(MigDeviceSharing)
	s.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *TimeSlicingConfig) DeepCopyInto(out *TimeSlicingConfig) {
	*out = *c
	if c.Interval != nil {
		interval := *c.Interval
		out.Interval = &interval
	}
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *TimeSlicingConfig) DeepCopy() *TimeSlicingConfig {
	if c == nil {
		return nil
	}
	out := new(TimeSlicingConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *MpsConfig) DeepCopyInto(out *MpsConfig) {
	*out = *c
	if c.DefaultActiveThreadPercentage != nil {
		p := *c.DefaultActiveThreadPercentage
		out.DefaultActiveThreadPercentage = &p
	}
	if c.DefaultPinnedDeviceMemoryLimit != nil {
		q := c.DefaultPinnedDeviceMemoryLimit.DeepCopy()
		out.DefaultPinnedDeviceMemoryLimit = &q
	}
	out.DefaultPerDevicePinnedMemoryLimit = c.DefaultPerDevicePinnedMemoryLimit.DeepCopy()
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *MpsConfig) DeepCopy() *MpsConfig {
	if c == nil {
		return nil
	}
	out := new(MpsConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopy returns a copy of m that shares nothing with it.
func (m MpsPerDevicePinnedMemoryLimit) DeepCopy() MpsPerDevicePinnedMemoryLimit {
	if m == nil {
		return nil
	}
	out := make(MpsPerDevicePinnedMemoryLimit, len(m))
	for k, v := range m {
		out[k] = v.DeepCopy()
	}
	return out
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *VfioDeviceConfig) DeepCopyInto(out *VfioDeviceConfig) {
	*out = *c
	out.TypeMeta = c.TypeMeta
	out.IOMMU = c.IOMMU.DeepCopy()
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *VfioDeviceConfig) DeepCopy() *VfioDeviceConfig {
	if c == nil {
		return nil
	}
	out := new(VfioDeviceConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *VfioDeviceConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *IOMMUConfig) DeepCopyInto(out *IOMMUConfig) {
	*out = *c
	if c.EnableAPIDevice != nil {
		enable := *c.EnableAPIDevice
		out.EnableAPIDevice = &enable
	}
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *IOMMUConfig) DeepCopy() *IOMMUConfig {
	if c == nil {
		return nil
	}
	out := new(IOMMUConfig)
	c.DeepCopyInto(out)
	return out
}
