package cdi

// StagingDir is the directory where versions before 2026-11-28 staged
// specs, so that tests can leave a file behind as such a version's killed
// Write would.
func StagingDir(w *Writer) string { return w.staging }

// Validate is validate, for the test that holds it to the CDI library's
// answer.
var Validate = validate
