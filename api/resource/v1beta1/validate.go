package v1beta1

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Features says which optional parts of this API the serving driver has
// turned on. The field names are those of the NVIDIA DRA driver's feature
// gates, and the zero value matches that driver's defaults (all off). It is
// passed to validation explicitly so that the plugin and the webhook can
// each validate against their own settings.
// +k8s:deepcopy-gen=false
type Features struct {
	// TimeSlicingSettings allows sharing strategy TimeSlicing.
	TimeSlicingSettings bool
	// MPSSupport allows sharing strategy MPS.
	MPSSupport bool
}

// featureGateOf names the feature gate each strategy needs.
var featureGateOf = map[SharingStrategy]string{
	TimeSlicingStrategy: "TimeSlicingSettings",
	MpsStrategy:         "MPSSupport",
}

func (f Features) allows(s SharingStrategy) bool {
	switch s {
	case TimeSlicingStrategy:
		return f.TimeSlicingSettings
	case MpsStrategy:
		return f.MPSSupport
	}
	return false
}

// mib is the unit of MPS pinned memory limits: the control daemon takes
// them in whole megabytes (set_default_device_pinned_mem_limit <uuid> <n>M),
// so a limit that is no whole number of MiB would be cut to one.
const mib = 1 << 20

// minPinnedMemoryLimit is the smallest MPS pinned memory limit, 1 MiB: 0
// means no limit to the daemon.
var minPinnedMemoryLimit = *resource.NewQuantity(mib, resource.BinarySI)

// maxPinnedMemoryLimit is the largest MPS pinned memory limit, the largest
// whole number of MiB below 2^63 bytes. The plugin hands limits to the
// daemon setup as int64 byte counts (Quantity.Value), which overflows
// silently above math.MaxInt64 (1e19 becomes 0, 2^63 becomes negative); the
// quantity parser clamps binary-suffixed values of 8Ei and more ("9999Ei")
// to exactly math.MaxInt64, which this bound refuses as well.
var maxPinnedMemoryLimit = *resource.NewQuantity(math.MaxInt64/mib*mib, resource.BinarySI)

// pinnedMemoryRange is the allowed values, as error messages give them.
var pinnedMemoryRange = fmt.Sprintf("must be a whole number of MiB (a multiple of 1Mi, %d bytes) from %s to %s", mib,
	minPinnedMemoryLimit.String(), maxPinnedMemoryLimit.String())

// validateStrategy reports whether s is a known strategy the caller serves.
// It returns false when the rest of the sharing setting should not be
// checked against the strategy.
func validateStrategy(s SharingStrategy, path *field.Path, f Features) (field.ErrorList, bool) {
	switch _, known := featureGateOf[s]; {
	case s == "":
		return field.ErrorList{field.Required(path, "supported values: "+quoted(SharingStrategies))}, false
	case !known:
		return field.ErrorList{field.NotSupported(path, s, SharingStrategies)}, false
	case !f.allows(s):
		return field.ErrorList{field.Forbidden(path, fmt.Sprintf("strategy %q requires the %s feature gate, which is disabled", s, featureGateOf[s]))}, true
	}
	return nil, true
}

func validateTimeSlicingConfig(c *TimeSlicingConfig, path *field.Path) field.ErrorList {
	if c == nil || c.Interval == nil || c.Interval.Int() >= 0 {
		return nil
	}
	return field.ErrorList{field.NotSupported(path.Child("interval"), *c.Interval, TimeSliceIntervals)}
}

// The MPS control daemon takes a default active thread percentage from 1
// to 100: 0 would leave the clients no threads.
const (
	minActiveThreadPercentage = 1
	maxActiveThreadPercentage = 100
)

// activeThreadRange is the allowed values, as error messages give them.
var activeThreadRange = fmt.Sprintf("must be from %d to %d: the MPS daemon takes 1 to 100, and 0 would leave the clients no threads", minActiveThreadPercentage, maxActiveThreadPercentage)

func validateMpsConfig(c *MpsConfig, path *field.Path) field.ErrorList {
	if c == nil {
		return nil
	}
	var errs field.ErrorList
	if p := c.DefaultActiveThreadPercentage; p != nil && (*p < minActiveThreadPercentage || *p > maxActiveThreadPercentage) {
		errs = append(errs, field.Invalid(path.Child("defaultActiveThreadPercentage"), *p, activeThreadRange))
	}
	if q := c.DefaultPinnedDeviceMemoryLimit; q != nil {
		errs = append(errs, validatePinnedMemoryLimit(*q, path.Child("defaultPinnedDeviceMemoryLimit"))...)
	}
	limitsPath := path.Child("defaultPerDevicePinnedMemoryLimit")
	for _, key := range slices.Sorted(maps.Keys(c.DefaultPerDevicePinnedMemoryLimit)) {
		if !isDeviceSelector(key) {
			errs = append(errs, field.Invalid(limitsPath.Key(key), key, "must be a device index (0, 1, ..., no sign or leading zero) or a device UUID (GPU-... or MIG-...)"))
		}
		errs = append(errs, validatePinnedMemoryLimit(c.DefaultPerDevicePinnedMemoryLimit[key], limitsPath.Key(key))...)
	}
	return errs
}

// validatePinnedMemoryLimit refuses a limit outside
// [minPinnedMemoryLimit, maxPinnedMemoryLimit] or not a whole number of
// MiB, so that every accepted limit reaches the daemon exactly: an int64
// byte count downstream, and a whole number of the daemon's unit. A limit
// is never rounded.
func validatePinnedMemoryLimit(q resource.Quantity, path *field.Path) field.ErrorList {
	// Value rounds a fraction of a byte up; the comparison tells.
	bytes := q.Value()
	switch exact := q.Cmp(*resource.NewQuantity(bytes, resource.BinarySI)) == 0; {
	case q.Cmp(minPinnedMemoryLimit) < 0:
		return field.ErrorList{field.Invalid(path, q.String(), pinnedMemoryRange)}
	case q.Cmp(maxPinnedMemoryLimit) > 0:
		msg := pinnedMemoryRange
		if q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.BinarySI)) == 0 {
			msg += fmt.Sprintf(" (quantities of 8Ei and more are read as %d)", int64(math.MaxInt64))
		}
		return field.ErrorList{field.Invalid(path, q.String(), msg)}
	case !exact || bytes%mib != 0:
		return field.ErrorList{field.Invalid(path, q.String(), pinnedMemoryRange)}
	}
	return nil
}

// isDeviceSelector reports whether key names a device the way the MPS
// daemon setup resolves it: a non-negative index or a GPU or MIG UUID.
func isDeviceSelector(key string) bool {
	if i, err := strconv.Atoi(key); err == nil {
		// One form per index: "00" or "+0" would name device 0 a second
		// time beside "0", and one of the two limits would be dropped.
		return i >= 0 && strconv.Itoa(i) == key
	}
	return (strings.HasPrefix(key, "GPU-") || strings.HasPrefix(key, "MIG-")) && len(key) > len("GPU-")
}

func quoted[T ~string](values []T) string {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = strconv.Quote(string(v))
	}
	return strings.Join(q, ", ")
}
