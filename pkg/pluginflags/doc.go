// Package pluginflags holds the flags of `gpudra kubelet-plugin` (and those
// it shares with `inspect` and `device-plugin`) and turns them into a
// plugin.Config. The binary parses its command line with them, and the
// local cluster parses the Helm chart's DaemonSet arguments with the same
// flag set, so that what the chart passes is what the simulated nodes run.
package pluginflags
