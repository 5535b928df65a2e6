package cdi_test

import (
	"context"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/pkg/cdi"
)

// TestNVCDIEditsWithoutDriver: on a machine without the NVIDIA driver (CI,
// simulated nodes), nvcdi cannot find the driver's files; CommonEdits must
// say so, and must not remember the failure: the driver may come up later.
func TestNVCDIEditsWithoutDriver(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := t.TempDir()
	edits := cdi.NewNVCDIEdits(cdi.NVCDIOptions{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: root})
	for i := range 2 {
		got, err := edits.CommonEdits(ctx, "580.65.06")
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

func TestNoDriverEditsAreEmpty(t *testing.T) {
	var edits cdi.DriverEdits = cdi.NoDriverEdits{}
	got, err := edits.CommonEdits(context.Background(), "580.65.06")
	if got != nil || err != nil {
		t.Errorf("NoDriverEdits.CommonEdits() = %+v, %v; want nil, nil", got, err)
	}
}
