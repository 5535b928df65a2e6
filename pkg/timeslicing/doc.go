// Package timeslicing holds CUDA time-slicing of full GPUs: which interval is
// in force on each GPU and which claims hold it ([Policy]), and how an
// interval is applied to a GPU ([Setter]).
//
// The time slice is a property of the whole GPU, not of a container or a
// claim: every process on the GPU runs with the interval last set. So all
// claims that share a GPU and ask for time-slicing must agree on the
// interval; the first one sets it, later ones with the same interval join,
// one with another interval is refused with a [*ConflictError], and the GPU
// goes back to Default when the last holder leaves.
//
// [Policy] is pure: it decides, the caller applies the returned [Step]
// through a [Setter] and persists the holders as [Record] values, from
// which [Rebuild] restores the policy after a restart. [NvidiaSMI] is the
// Setter for real nodes (NVML has no public call for this on bare metal);
// [Memory] serves simulated nodes and tests.
package timeslicing
