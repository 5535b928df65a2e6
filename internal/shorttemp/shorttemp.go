// Package shorttemp makes temporary directories short enough for unix
// sockets, for tests.
//
// A unix socket's path is limited to 108 bytes (sun_path, the NUL
// included). The kubelet plugin's registration and DRA sockets, the device
// plugin's and the MPS daemons' pipes lie a few levels below a test's
// directory, and t.TempDir's path, which holds the test's name, leaves too
// little room for them. A directory made here, directly under $TMPDIR
// (normally /tmp), leaves enough.
package shorttemp

import (
	"os"
	"testing"
)

// Dir returns a new directory directly under the temporary directory,
// removed when the test ends (after the cleanups registered after this
// call, which may stop what still uses it).
func Dir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "gd")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove short temporary directory: %v", err)
		}
	})
	return dir
}
