package nvmlhw

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SetMIGMode implements [hardware.MIGModeSwitcher] with
// nvmlDeviceSetMigMode. It does nothing when the GPU is in that mode
// already, with no change pending, and refuses to turn MIG mode off while
// GPU instances exist, naming them.
//
// nvmlDeviceSetMigMode may succeed without the new mode taking effect: it
// reports why in its activation status. The error then wraps that status,
// so callers can tell with errors.Is: NVML_ERROR_RESET_REQUIRED (the
// change is pending until the GPU is reset or the node reboots, as on
// A100s whose driver cannot reset them in place) or NVML_ERROR_IN_USE
// (another client holds the GPU; stop it and retry).
func (d *Discoverer) SetMIGMode(ctx context.Context, gpuUUID string, enabled bool) error {
	mode, word := nvml.DEVICE_MIG_DISABLE, "off"
	if enabled {
		mode, word = nvml.DEVICE_MIG_ENABLE, "on"
	}
	err := d.withNVML(ctx, func(lib nvml.Interface) error { return setMIGMode(lib, gpuUUID, mode) })
	if err != nil {
		return fmt.Errorf("turn MIG mode of GPU %s %s: %w", gpuUUID, word, err)
	}
	return nil
}

func setMIGMode(lib nvml.Interface, gpuUUID string, mode int) error {
	dev, err := gpuByUUID(lib, gpuUUID)
	if err != nil {
		return err
	}
	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return errors.New("the GPU does not support MIG")
	case ret != nvml.SUCCESS:
		return fmt.Errorf("nvmlDeviceGetMigMode: %w", ret)
	case current == mode && pending == mode:
		return nil
	}
	if mode == nvml.DEVICE_MIG_DISABLE && current == nvml.DEVICE_MIG_ENABLE {
		held, err := existingGPUInstances(dev)
		if err != nil {
			return err
		}
		if len(held) > 0 {
			return fmt.Errorf("%d GPU instance(s) exist (%s); destroy them first", len(held), strings.Join(held, ", "))
		}
	}
	activation, ret := dev.SetMigMode(mode)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("nvmlDeviceSetMigMode: %w (it needs root)", ret)
	default:
		return fmt.Errorf("nvmlDeviceSetMigMode: %w", ret)
	}
	switch activation {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_RESET_REQUIRED:
		return fmt.Errorf("the change is pending until the GPU is reset or the node reboots: %w", activation)
	case nvml.ERROR_IN_USE:
		return fmt.Errorf("the change is pending: other clients use the GPU; stop them and retry, or reset the GPU: %w", activation)
	default:
		return fmt.Errorf("the change is pending: activation failed: %w", activation)
	}
}

// existingGPUInstances names the GPU instances on a MIG-enabled GPU:
// "GI 7 (profile 19 at 0)".
func existingGPUInstances(dev nvml.Device) ([]string, error) {
	profiles, err := giProfiles(dev)
	if err != nil {
		return nil, err
	}
	var held []string
	for _, p := range profiles {
		gis, err := gpuInstances(dev, p)
		if err != nil {
			return nil, err
		}
		for _, gi := range gis {
			info, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("nvmlGpuInstanceGetInfo: %w", ret)
			}
			held = append(held, fmt.Sprintf("GI %d (profile %d at %d)", info.Id, info.ProfileId, info.Placement.Start))
		}
	}
	return held, nil
}
