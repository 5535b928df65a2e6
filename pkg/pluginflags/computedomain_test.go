package pluginflags

import (
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// TestComputeDomainPluginConfig: what the flags say reaches the channel
// plugin's configuration, with the hardware given in place of NVML, and
// bad flags are refused naming the flag.
func TestComputeDomainPluginConfig(t *testing.T) {
	fleet, err := simfleet.Load("gb200-nvl72")
	if err != nil {
		t.Fatal(err)
	}
	fn := fleet.Nodes[0]
	o, err := ParseComputeDomainPlugin([]string{"--node-name=" + fn.Name, "--pod-uid=abc", "--driver-name=cd.example.com",
		"--registrar-dir=/r", "--cdi-dir=/c", "--max-channels=16", "--shared-channel=false", "--kubelet-call-timeout=20s",
		"--kube-api-qps=7.5", "--http-endpoint=:9091", "--device-metadata=false", "--v=4"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := o.Config(nil, nil, fn.Hardware(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != fn.Name || cfg.RollingUpdateUID != "abc" || cfg.DriverName != "cd.example.com" ||
		cfg.PluginDataDir != "/var/lib/kubelet/plugins/cd.example.com" || cfg.RegistrarDir != "/r" || cfg.CDIDir != "/c" ||
		cfg.CallTimeout != 20*time.Second || cfg.Features == nil || cfg.Hardware == nil || o.KubeAPIQPS != 7.5 || o.HTTPEndpoint != ":9091" || cfg.DeviceMetadata {
		t.Errorf("config %+v does not say what the flags say", cfg)
	}
	set, err := cfg.Features(draplugin.FeatureEnv{})
	if err != nil || set == nil {
		t.Errorf("features: %v", err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-name=n", "--max-channels=0"}, "--max-channels 0"},
		{[]string{"--node-name=n", "--metrics-path=m"}, "--metrics-path"},
		{[]string{"--node-name=n", "--driver-root=rel"}, "--driver-root"},
		{[]string{"--node-name="}, "--node-name"},
		// The IMEX flags are the plugin's: parsed and checked with it.
		{[]string{"--node-name=n", "--imex-daemon=sometimes"}, "--imex-daemon"},
		{[]string{"--node-name=n", "--imex-port=50005"}, "--imex-cmd-port"},
		{[]string{"--node-name=n", "--imex-hosts-file=hosts"}, "--imex-hosts-file"},
		{[]string{"--node-name=n", "--imex-daemon=required", "--imex-max-nodes=0"}, "--imex-max-nodes"},
	} {
		o, err := ParseComputeDomainPlugin(tc.args)
		if err == nil {
			_, err = o.Config(nil, nil, fn.Hardware(), nil)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
	o, err = ParseComputeDomainPlugin([]string{"--imex-daemon=required", "--imex-binary=/b/imex", "--imex-port=7000", "--clique-namespace=ns", "--node-ip=10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.IMEX; got.Daemon != IMEXDaemonRequired || got.Binary != "/b/imex" || got.Port != 7000 || got.CliqueNamespace != "ns" || got.NodeIP != "10.0.0.1" {
		t.Errorf("IMEX flags %+v do not say what the arguments say", got)
	}
	if _, err := ParseComputeDomainPlugin([]string{"--imex-bogus=1"}); err == nil || !strings.Contains(err.Error(), "unknown flag") {
		t.Errorf("unknown flag: %v", err)
	}
}
