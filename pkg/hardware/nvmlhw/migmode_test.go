package nvmlhw_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What nvmlDeviceSetMigMode reports, in its result and in its activation
// status, becomes an error that says what to do and wraps NVML's code.
func TestSetMIGModeActivation(t *testing.T) {
	tests := []struct {
		name            string
		ret, activation nvml.Return
		want            string // "" for success
	}{
		{"done", nvml.SUCCESS, nvml.SUCCESS, ""},
		{"reset required", nvml.SUCCESS, nvml.ERROR_RESET_REQUIRED, "pending until the GPU is reset or the node reboots"},
		{"in use", nvml.SUCCESS, nvml.ERROR_IN_USE, "other clients use the GPU; stop them and retry"},
		{"activation failed", nvml.SUCCESS, nvml.ERROR_UNKNOWN, "activation failed"},
		{"not root", nvml.ERROR_NO_PERMISSION, nvml.SUCCESS, "nvmlDeviceSetMigMode: " + nvml.ERROR_NO_PERMISSION.Error() + " (it needs root)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMIGMock()
			m.gpu.GetMigModeFunc = func() (int, int, nvml.Return) {
				return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
			}
			m.gpu.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
			var asked []int
			m.gpu.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
				asked = append(asked, mode)
				return tt.activation, tt.ret
			}
			lib := newMockLib(m.gpu)
			lib.lib.DeviceGetHandleByUUIDFunc = func(string) (nvml.Device, nvml.Return) { return m.gpu, nvml.SUCCESS }
			err := lib.hardware(standard).SetMIGMode(context.Background(), "GPU-0", true)
			if len(asked) != 1 || asked[0] != nvml.DEVICE_MIG_ENABLE {
				t.Errorf("nvmlDeviceSetMigMode asked for %v, want [%d]", asked, nvml.DEVICE_MIG_ENABLE)
			}
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("got %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) ||
				!strings.HasPrefix(err.Error(), "turn MIG mode of GPU GPU-0 on: ")):
				t.Errorf("got %v, want an error saying %q", err, tt.want)
			case tt.want != "" && !errors.Is(err, tt.ret) && !errors.Is(err, tt.activation):
				t.Errorf("%v wraps neither %v nor %v", err, tt.ret, tt.activation)
			}
			if lib.shutdowns != 1 {
				t.Errorf("Shutdown called %d times, want 1", lib.shutdowns)
			}
		})
	}
}

// A MIG device's UUID is no GPU to manage.
func TestMIGOperationsRefuseMIGHandles(t *testing.T) {
	m := newMIGMock(mig1gAt0)
	m.migs[0].dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	lib := newMockLib(m.gpu)
	lib.lib.DeviceGetHandleByUUIDFunc = func(string) (nvml.Device, nvml.Return) { return m.migs[0].dev, nvml.SUCCESS }
	err := lib.hardware(standard).SetMIGMode(context.Background(), "MIG-0", false)
	if err == nil || !strings.Contains(err.Error(), "MIG-0 is a MIG device, not a GPU") {
		t.Errorf("got %v", err)
	}
}
