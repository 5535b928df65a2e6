package simfleet

import (
	"encoding/json"
	"fmt"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/deviceplugin"
)

// PluginSettings are the settings of the gpudra plugin that serves a
// simulated node: what the local cluster runs the node's plugin with, and
// what the --fleet of gpudra's commands takes for the node where a flag is
// not given. They are no hardware, so they live here, beside the node's
// hardware (package sim) in its fleet file entry.
type PluginSettings struct {
	// MIGMode is the --mig-mode the node's plugin runs with, "dynamic" or
	// "static"; empty leaves it to the plugin (dynamic). A node whose
	// operator created MIG devices is "static".
	MIGMode string `json:"migMode,omitempty"`
	// MIGModeSwitching is the plugin's --mig-mode-switching: with dynamic
	// MIG, Hopper and newer GPUs are offered both whole and as every MIG
	// placement, whatever their MIG mode.
	MIGModeSwitching bool `json:"migModeSwitching,omitempty"`
	// Sharing is the --sharing the node's plugin runs with: "none",
	// "memory-compute", "shares=<N>" or "unlimited"; empty leaves it to
	// the plugin (none).
	Sharing string `json:"sharing,omitempty"`
	// SharingDefault is the --sharing-default the node's plugin runs with:
	// "whole" (a claim that asks for no capacity gets the whole GPU) or
	// "share" (one share, as NVIDIA's driver gives); empty leaves it to the
	// plugin (whole).
	SharingDefault string `json:"sharingDefault,omitempty"`
	// Mode is which of gpudra's plugins serves the node's GPUs in the
	// local cluster: "dra" (the default) or "device-plugin" (gpudra's
	// device plugin under the kubelet's device manager).
	Mode string `json:"mode,omitempty"`
	// DevicePlugin is the device plugin's config file, NVIDIA's format
	// (version, flags.migStrategy, sharing.timeSlicing), for a node in
	// device-plugin mode.
	DevicePlugin json.RawMessage `json:"devicePlugin,omitempty"`
}

// The modes of a node ([PluginSettings.Mode]).
const (
	ModeDRA          = "dra"
	ModeDevicePlugin = "device-plugin"
)

// DevicePluginConfig is the node's device-plugin config, nil when it has
// none (its defaults).
func (s *PluginSettings) DevicePluginConfig() (*deviceplugin.Config, error) {
	if len(s.DevicePlugin) == 0 {
		return nil, nil
	}
	return deviceplugin.ParseConfig(s.DevicePlugin)
}

// GPUSharing is how the node's plugin shares full GPUs, from its sharing
// and sharingDefault fields; the zero Sharing when neither is set.
func (n *Node) GPUSharing() (devicemodel.Sharing, error) {
	var s devicemodel.Sharing
	var err error
	if n.Sharing != "" {
		if s, err = devicemodel.ParseSharing(n.Sharing); err != nil {
			return devicemodel.Sharing{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if n.SharingDefault != "" {
		if s.ShareByDefault, err = devicemodel.ParseSharingDefault(n.SharingDefault); err != nil {
			return devicemodel.Sharing{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return s, nil
}

// validate reports what is wrong with the settings of the node that where
// names (as sim.NodePlace does), each problem as "<where>: <field>: <what>".
func (s *PluginSettings) validate(where string) []error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", where, field, fmt.Sprintf(format, args...)))
	}
	switch s.MIGMode {
	case "", "dynamic", "static":
	default:
		add("migMode", "%q: must be dynamic or static", s.MIGMode)
	}
	if s.MIGModeSwitching && s.MIGMode == "static" {
		add("migModeSwitching", "only with migMode: dynamic")
	}
	if s.Sharing != "" {
		if _, err := devicemodel.ParseSharing(s.Sharing); err != nil {
			add("sharing", "%v", err)
		}
	}
	if s.SharingDefault != "" {
		if _, err := devicemodel.ParseSharingDefault(s.SharingDefault); err != nil {
			add("sharingDefault", "%v", err)
		}
	}
	switch s.Mode {
	case "", ModeDRA, ModeDevicePlugin:
	default:
		add("mode", "%q: must be %s or %s", s.Mode, ModeDRA, ModeDevicePlugin)
	}
	if len(s.DevicePlugin) > 0 {
		if s.Mode != ModeDevicePlugin {
			add("devicePlugin", "only for a node with mode: %s", ModeDevicePlugin)
		} else if _, err := deviceplugin.ParseConfig(s.DevicePlugin); err != nil {
			add("devicePlugin", "%v", err)
		}
	}
	return errs
}
