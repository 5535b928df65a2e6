//go:build race

package chaos

// raceEnabled: the harness runs with the race detector, and so does the
// plugin binary it builds.
const raceEnabled = true
