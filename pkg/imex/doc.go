// Package imex runs the node's one nvidia-imex daemon for the
// ComputeDomain channel plugin: it writes the daemon's config and its peer
// list once, starts the daemon when the node first holds a channel claim
// ([Supervisor.Hold]) and stops it when the last claim is gone, takes over
// a daemon a previous plugin started, restarts a dead one with backoff,
// and says whether it is ready (nvidia-imex-ctl -q answering READY).
//
// One daemon serves every domain on the node: channels, not daemons, keep
// domains apart, so a node can serve more than one ComputeDomain. Peers are
// named by DNS names, one per clique index (compute-domain-daemon-NNNN),
// which resolve through a block of a hosts file that gpudra rewrites
// ([HostsFile]); the daemon re-resolves them on SIGUSR1, so a node joining
// or leaving never restarts it. docs/guides/computedomain.md has the design.
package imex
