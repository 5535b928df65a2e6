// Package checkpoint persists the prepared-claim state of the kubelet plugin
// ([claimstate.State]) in one JSON file, checkpoint.json, in the plugin's
// data directory.
//
// The file names its schema version and carries no checksum: v2 and v5 are
// read, a newer version is never overwritten, any other version is
// unreadable, and unknown fields within a known version are tolerated. What each device
// configurator set up for a claim is kept as an opaque, named record; a
// file that requires a record this process does not know is left alone
// like a newer version, so a new feature needs no new schema version. The
// file is replaced atomically (temp file, rename) without fsync, because
// its content is only valid for the boot that wrote it; docs/design/checkpoint.md
// gives the reasoning.
//
// A lost file (unreadable, not a regular file, or gone) is moved aside and
// the Store refuses every call with [ErrNeedsAdoption] until its owner has
// adopted the claims still prepared on the node ([Store.Recover]).
//
// A [Store] serialises the updates of one process and group-commits
// concurrent ones into a single write. An exclusive flock on checkpoint.lock
// serialises the read-modify-write cycles of all processes that share the
// directory, as two plugin processes do during a rolling update.
package checkpoint
