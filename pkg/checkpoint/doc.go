// Package checkpoint persists the prepared-claim state of the kubelet plugin
// ([claimstate.State]) in one JSON file, checkpoint.json, in the plugin's
// data directory.
//
// The file names its schema version and carries no checksum: older versions
// are migrated when read, a newer version is never overwritten, and unknown
// fields within a known version are tolerated. The file is replaced
// atomically (temp file, rename) without fsync, because its content is only
// valid for the boot that wrote it; docs/checkpoint.md gives the reasoning.
//
// A [Store] serialises the updates of one process and group-commits
// concurrent ones into a single write. An exclusive flock on checkpoint.lock
// serialises the read-modify-write cycles of all processes that share the
// directory, as two plugin processes do during a rolling update.
package checkpoint
