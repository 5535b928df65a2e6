//go:build !race

package chaos

// raceEnabled: the harness runs without the race detector, and so does
// the plugin binary it builds.
const raceEnabled = false
