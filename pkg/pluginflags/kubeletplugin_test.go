package pluginflags

import (
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/simfleet"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// TestKubeletPluginConfig: what the flags say reaches the plugin's
// configuration, and a Host's parts replace what the flags would make.
func TestKubeletPluginConfig(t *testing.T) {
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	fn := fleet.Nodes[0]
	hw := fn.Hardware()
	args := []string{"--node-name=" + fn.Name, "--pod-uid=abc", "--driver-name=gpu.example.com",
		"--plugin-data-dir=/p/gpu.example.com", "--registrar-dir=/r", "--cdi-dir=/c",
		"--mig-mode=static", "--sharing=shares=4", "--vfio=only", "--vfio-gpus=1,2", "--kube-api-qps=7",
		"--health-effect=NoExecute", "--health-report-interval=5s", "--mps-root=/m", "--v=4"}
	o, fs, err := ParseKubeletPlugin(args)
	if err != nil {
		t.Fatal(err)
	}
	slicer := &timeslicing.Memory{}
	cfg, err := o.Config(fs, nil, Host{Hardware: hw, TimeSlicer: slicer, DriverEdits: cdi.NoDriverEdits{}, MPSUnavailable: "none here", VFIO: &draplugin.VFIOConfig{}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != fn.Name || cfg.RollingUpdateUID != "abc" || cfg.DriverName != "gpu.example.com" ||
		cfg.PluginDataDir != "/p/gpu.example.com" || cfg.RegistrarDir != "/r" || cfg.CDIDir != "/c" ||
		cfg.MIGMode != draplugin.MIGModeStatic || cfg.Sharing.Shares != 4 || string(cfg.HealthPolicy.FaultEffect) != "NoExecute" ||
		cfg.HealthReportInterval != 5*time.Second || !cfg.DeviceMetadata {
		t.Errorf("config %+v does not say what the flags say", cfg)
	}
	if cfg.Hardware != hw || cfg.TimeSlicer != slicer || cfg.MPS != nil || cfg.MPSUnavailable != "none here" {
		t.Errorf("the host's parts were not used: %+v", cfg)
	}
	if cfg.VFIO == nil || string(cfg.VFIO.Mode) != "only" || len(cfg.VFIO.GPUs) != 2 {
		t.Errorf("VFIO %+v, want only, GPUs 1 and 2", cfg.VFIO)
	}
	if o.KubeAPIQPS != 7 {
		t.Errorf("--kube-api-qps %v", o.KubeAPIQPS)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mig-mode=sometimes"}, "--mig-mode"},
		{[]string{"--vfio=maybe"}, "--vfio"},
		{[]string{"--health-effect=Loud"}, "health-effect"},
		{[]string{"--health-report-interval=30s"}, "--health-report-interval 30s: must be more than 0 and less than 30s"},
		{[]string{"--health-report-interval=0s"}, "--health-report-interval"},
	} {
		o, fs, err := ParseKubeletPlugin(append([]string{"--node-name=n"}, tc.args...))
		if err == nil {
			_, err = o.Config(fs, nil, Host{Hardware: hw, NoVFIO: true})
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
	if _, _, err := ParseKubeletPlugin([]string{"--no-such-flag"}); err == nil {
		t.Error("an unknown flag parses")
	}
}
