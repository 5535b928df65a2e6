// +k8s:deepcopy-gen=package

// Package v1beta1 holds the opaque device configuration API of gpudra, API
// group resource.nvidia.com, version v1beta1.
//
// # Compatibility with the NVIDIA DRA driver
//
// The kinds, JSON field names and allowed values are those of the NVIDIA DRA
// driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
// NVIDIA/k8s-dra-driver-gpu), so the opaque parameters of ResourceClaims and
// DeviceClasses written for that driver decode here unchanged:
//
//	apiVersion: resource.nvidia.com/v1beta1
//	kind: GpuConfig
//	sharing:
//	  strategy: TimeSlicing          # or MPS
//	  timeSlicingConfig:
//	    interval: Long               # Default, Short, Medium, Long
//
// Behaviour follows that driver's current release where it is defined:
//   - A config without sharing means exclusive use of the device; time-slicing
//     is never implied (DefaultGpuConfig and DefaultMigDeviceConfig carry no
//     sharing).
//   - Normalize fills in what a strategy implies: TimeSlicing gets interval
//     Default, MPS gets an empty mpsConfig.
//   - Decoding is strict: unknown fields, duplicate fields, wrong JSON types
//     and unknown kinds are errors, as with that driver's strict decoder.
//
// Where this package differs, it is stricter only about configs that driver
// would reject later, at prepare time, and it says so at validation time with
// the field path and the allowed values:
//   - an MPS memory limit below 1Mi, or a per-device limit whose key is neither
//     a device index nor a GPU/MIG UUID;
//   - a timeSlicingConfig next to strategy MPS, or an mpsConfig next to
//     strategy TimeSlicing, on a GpuConfig;
//   - a timeSlicingConfig without an interval is accepted and means Default
//     (that driver fails on it);
//   - a VfioDeviceConfig whose iommu section lacks backendPolicy is accepted
//     and means LegacyOnly (that driver fails on it).
//
// A VfioDeviceConfig defaults to backendPolicy LegacyOnly with
// enableAPIDevice true, as that driver does since its PR #1481 (released
// with v0.6.0; v0.5.0 defaulted enableAPIDevice to false).
//
// Validation never reads process-global feature gates: the caller passes
// [Features]. Its zero value, like that driver's default gates, serves no
// sharing strategy.
//
// Additions of gpudra will be new optional fields; existing fields keep their
// names and meaning.
//
// The configs of driver compute-domain.nvidia.com, ComputeDomainChannelConfig
// and ComputeDomainDaemonConfig (domainID, allocationMode), decode through
// the same strict machinery. A domainID must be a label value (a
// ComputeDomain's UID is); NVIDIA's driver refuses the same IDs at prepare
// time. The custom resources ComputeDomain and ComputeDomainClique live in
// this package too, registered apart (AddResourcesToScheme) so that Decode
// never takes one for device parameters.
package v1beta1
