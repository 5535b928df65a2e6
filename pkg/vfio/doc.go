// Package vfio hands a whole GPU to a workload through VFIO passthrough: it
// moves every PCI function of the GPU's IOMMU group from its driver to a
// VFIO driver and back, and says which device nodes the workload then needs.
//
// The work is split so that a crash can always be undone:
//
//  1. [Binder.Plan] reads sysfs and returns a [Record]: the group, and for
//     each function its original driver and driver_override. It changes
//     nothing. The caller persists the record (the kubelet plugin's
//     checkpoint) before going on.
//  2. [Binder.Bind] refuses a GPU in use, loads the VFIO driver module and,
//     function by function, sets driver_override, unbinds the function and
//     binds it to the VFIO driver. On any failure it restores the record
//     before returning.
//  3. [Binder.Restore] undoes Bind from whatever state it finds, so it is
//     what Unprepare calls and what recovers a Bind cut short by a crash.
//  4. [DeviceNodes] returns /dev/vfio/<group> and /dev/vfio/vfio, or with
//     iommufd /dev/vfio/devices/vfio<N> and /dev/iommu, with the majors and
//     minors sysfs gives them.
//
// All sysfs access goes through [FS]: [Dir] on a real node (the plugin's
// --sysfs-root), and package fakesysfs, which models the kernel's side of
// each write, in tests and on simulated nodes. [ReadPCIDevice] gives the
// vendor and device IDs and IOMMU group that discovery publishes.
//
// See docs/guides/vfio.md for the crash story and what is and is not checked.
package vfio
