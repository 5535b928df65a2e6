// Package proctable is what gpudra's daemon supervisors (pkg/mps for MPS
// control daemons, pkg/imex for the node's IMEX daemon) share: reading the
// process table to find, identify and signal daemons that are nobody's
// child (a restarted plugin takes them over), and starting a program
// detached from the plugin, directly or as a transient systemd service.
//
// A PID alone may name another process once the first is gone, so a
// process is named by a [Ref]: its PID and its start time.
package proctable
