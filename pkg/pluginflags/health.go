package pluginflags

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/health"
)

// Health flags set the health policy (docs/guides/health.md).
type Health struct {
	ignoreXIDs     string
	faultEffect    string
	lostEffect     string
	reportInterval time.Duration
}

// AddFlags adds the flags to fs.
func (f *Health) AddFlags(fs *pflag.FlagSet) {
	d := health.DefaultPolicy()
	fs.StringVar(&f.ignoreXIDs, "health-ignore-xids", health.FormatXIDs(d.IgnoreXIDs), "XIDs that taint nothing (application errors), comma-separated; the default is NVIDIA's list. See docs/guides/health.md")
	fs.StringVar(&f.faultEffect, "health-effect", string(d.FaultEffect), "effect of the taints of a GPU's XID and double-bit ECC errors, one of None, NoSchedule, NoExecute")
	fs.StringVar(&f.lostEffect, "health-lost-effect", string(d.LostEffect), "effect of the taint of a GPU lost off the bus, one of None, NoSchedule, NoExecute")
	fs.DurationVar(&f.reportInterval, "health-report-interval", draplugin.DefaultHealthReportInterval, fmt.Sprintf("how often the devices' health is sent to the kubelet again when nothing changed (KEP-4680); under the %v the kubelet keeps a report, so a device never decays to Unknown", draplugin.HealthCheckTimeout))
}

// ReportInterval returns --health-report-interval, checked: more than 0
// and less than the lease the kubelet keeps a report for.
func (f *Health) ReportInterval() (time.Duration, error) {
	if f.reportInterval <= 0 || f.reportInterval >= draplugin.HealthCheckTimeout {
		return 0, fmt.Errorf("--health-report-interval %v: must be more than 0 and less than %v, the time the kubelet keeps a device's health", f.reportInterval, draplugin.HealthCheckTimeout)
	}
	return f.reportInterval, nil
}

// Policy returns the policy the flags set; errors name the flag and the
// allowed values.
func (f *Health) Policy() (health.Policy, error) {
	var p health.Policy
	var err error
	if p.IgnoreXIDs, err = health.ParseXIDs("health-ignore-xids", f.ignoreXIDs); err != nil {
		return p, err
	}
	if p.IgnoreXIDs == nil {
		p.IgnoreXIDs = []uint64{} // ignore nothing, not the default
	}
	if p.FaultEffect, err = health.ParseEffect("health-effect", f.faultEffect); err != nil {
		return p, err
	}
	if p.LostEffect, err = health.ParseEffect("health-lost-effect", f.lostEffect); err != nil {
		return p, err
	}
	return p, p.Validate()
}
