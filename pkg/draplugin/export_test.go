package draplugin

import "context"

// UnchangedDiscoveries returns how many periodic discoveries of d found
// the hardware and the prepared claims as the current publication was made
// from, and so built nothing (for the tests).
func UnchangedDiscoveries(d *Driver) int64 { return d.unchangedDiscoveries.Load() }

// PeriodicSweep sweeps as the plugin's periodic loop does, backing off
// from claims the API server had (for the tests).
func PeriodicSweep(d *Driver, ctx context.Context) { d.sweeper.sweep(ctx, true) }
