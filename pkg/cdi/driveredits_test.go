package cdi_test

import (
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/pkg/cdi"
)

// TestNVCDIEditsWithoutDriver: on a machine without the NVIDIA driver (CI,
// simulated nodes), nvcdi cannot find the driver's files; CommonEdits must
// say so, and must not remember the failure: the driver may come up later.
func TestNVCDIEditsWithoutDriver(t *testing.T) {
	root := t.TempDir()
	logger, _ := ktesting.NewTestContext(t)
	edits := cdi.NewNVCDIEdits(logger, cdi.NVCDIOptions{DriverRoot: root})
	for i := range 2 {
		got, err := edits.CommonEdits()
		if err == nil {
			t.Skipf("nvcdi found a driver (edits %+v); this test needs a machine without one", got)
		}
		if got != nil {
			t.Errorf("call %d: edits %+v returned with error %v", i+1, got, err)
		}
		if !strings.Contains(err.Error(), "nvcdi") {
			t.Errorf("call %d: error %q does not say it came from nvcdi", i+1, err)
		}
	}
}
