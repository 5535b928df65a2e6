package cdi

// StagingDir is the directory Write stages specs in, so that tests can
// leave a file behind as a killed Write would.
func StagingDir(w *Writer) string { return w.staging }
