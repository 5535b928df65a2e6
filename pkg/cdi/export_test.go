package cdi

// TempPattern is the os.CreateTemp pattern Write uses for a claim's temp
// file, so that tests can leave one behind as a killed Write would.
func TempPattern(w *Writer, claimUID string) string { return w.tempPattern(claimUID) }
