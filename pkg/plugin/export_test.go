package plugin

// UnchangedDiscoveries returns how many periodic discoveries of d found
// the hardware and the prepared claims as the current publication was made
// from, and so built nothing (for the tests).
func UnchangedDiscoveries(d *Driver) int64 { return d.unchangedDiscoveries.Load() }
