package nvmlhw

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// CheckHealth implements [hardware.HealthChecker]: each GPU NVML lists,
// lost or not, and the recovery action its driver asks for. It reads what
// the health watcher's poll reads, once.
func (d *Discoverer) CheckHealth(ctx context.Context) (conds []hardware.GPUCondition, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	lib, err := d.initialized(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS && err == nil {
			err = fmt.Errorf("check GPU health: nvmlShutdown: %w", ret)
		}
	}()
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: check GPU health: nvmlDeviceGetCount: %w", hardware.ErrUnavailable, ret)
	}
	conds = make([]hardware.GPUCondition, 0, count)
	for i := 0; i < count; i++ {
		conds = append(conds, conditionOf(lib, i))
	}
	return conds, nil
}

// conditionOf reads the condition of the GPU with NVML index i.
func conditionOf(lib nvml.Interface, i int) hardware.GPUCondition {
	c := hardware.GPUCondition{Index: i}
	failed := func(call string, ret nvml.Return) hardware.GPUCondition {
		if ret == nvml.ERROR_GPU_IS_LOST {
			c.Lost = true
		} else {
			c.Err = fmt.Sprintf("GPU %d: %s: %v", i, call, ret)
		}
		return c
	}
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return failed("nvmlDeviceGetHandleByIndex", ret)
	}
	if c.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		c.UUID = ""
		return failed("nvmlDeviceGetUUID", ret)
	}
	action, ret := recoveryAction(dev)
	switch ret {
	case nvml.SUCCESS:
		c.Recovery = recoveryName(action)
	case nvml.ERROR_NOT_SUPPORTED:
		c.Recovery = hardware.RecoveryUnreported
	default:
		return failed("nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)", ret)
	}
	return c
}

// recoveryName names NVML's recovery action.
func recoveryName(a nvml.DeviceGpuRecoveryAction) hardware.RecoveryAction {
	switch a {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return hardware.RecoveryNone
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return hardware.RecoveryGPUReset
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return hardware.RecoveryNodeReboot
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return hardware.RecoveryDrainP2P
	case nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return hardware.RecoveryDrainAndReset
	case nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN:
		return hardware.RecoveryRecoverIMEXDomain
	}
	return hardware.RecoveryAction(fmt.Sprintf("action-%d", a))
}
