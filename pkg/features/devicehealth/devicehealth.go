// Package devicehealth publishes the health of a node's GPUs: the devices
// of an unhealthy GPU carry device taints (KEP-5055) as package health's
// policy says, or, where the API server lacks device taints, are left out
// of the publication until the GPU recovers.
package devicehealth

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Publisher shapes the publication by the GPUs' health. It is a publisher
// only: health needs nothing at Prepare.
type Publisher struct {
	driverName string
	policy     health.Policy
	// state is the GPUs' health now; nil while all are healthy.
	state atomic.Pointer[health.State]
	// taints says whether the API server keeps device taints; when it does
	// not, unhealthy GPUs are withdrawn instead.
	taints atomic.Bool
}

var (
	_ preparer.Publisher        = &Publisher{}
	_ preparer.FallbackProvider = &Publisher{}
)

// New returns the publisher of a driver's devices under the policy.
func New(driverName string, policy health.Policy) (*Publisher, error) {
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{driverName: driverName, policy: policy}
	p.taints.Store(true)
	return p, nil
}

// Policy returns the publisher's policy.
func (p *Publisher) Policy() health.Policy { return p.policy }

// State returns the health the next publication uses.
func (p *Publisher) State() *health.State { return p.state.Load() }

// SetState makes s the health the next publication uses.
func (p *Publisher) SetState(s *health.State) { p.state.Store(s) }

// Tainting reports whether unhealthy GPUs are tainted (rather than
// withdrawn).
func (p *Publisher) Tainting() bool { return p.taints.Load() }

// Publish implements [preparer.Publisher]. With taints, a lost GPU that
// discovery no longer lists stays published as the previous publication
// saw it, so that its devices carry the gpu-lost taint (whose NoExecute
// evicts the pods using them) instead of vanishing, which would evict
// nothing. Without taints, unhealthy GPUs are left out.
func (p *Publisher) Publish(in *preparer.PublishInput) {
	s := p.state.Load()
	unhealthy := s.Unhealthy()
	if len(unhealthy) == 0 {
		return
	}
	if !p.taints.Load() {
		p.withdraw(in, s, unhealthy)
		return
	}
	p.keepLost(in, s)
	policy, driver := p.policy, p.driverName
	in.Options = append(in.Options, devicemodel.WithTaints(func(uuid string) []resourceapi.DeviceTaint {
		return s.Condition(uuid).Taints(driver, policy)
	}))
}

// keepLost puts back lost GPUs that the previous publication had.
func (p *Publisher) keepLost(in *preparer.PublishInput, s *health.State) {
	if in.Previous == nil {
		return
	}
	var missing []hardware.GPU
	for _, g := range in.Previous.GPUs {
		if s.Condition(g.UUID).Lost && !slices.ContainsFunc(in.Inventory.GPUs, func(n hardware.GPU) bool { return n.UUID == g.UUID }) {
			missing = append(missing, g)
		}
	}
	if len(missing) == 0 {
		return
	}
	out := *in.Inventory
	out.GPUs = append(slices.Clone(in.Inventory.GPUs), missing...)
	slices.SortStableFunc(out.GPUs, func(a, b hardware.GPU) int { return a.Index - b.Index })
	in.Inventory = &out
}

// withdraw leaves the unhealthy GPUs out, with a notice.
func (p *Publisher) withdraw(in *preparer.PublishInput, s *health.State, unhealthy []string) {
	out := *in.Inventory
	out.GPUs = nil
	var gone []string
	for _, g := range in.Inventory.GPUs {
		if slices.Contains(unhealthy, g.UUID) {
			gone = append(gone, fmt.Sprintf("%s (%s)", g.UUID, s.Condition(g.UUID)))
			continue
		}
		out.GPUs = append(out.GPUs, g)
	}
	in.Inventory = &out
	if len(gone) > 0 {
		in.Notices = append(in.Notices, preparer.Notice{
			Reason:  "UnhealthyGPUsWithdrawn",
			Message: fmt.Sprintf("%d unhealthy GPU(s) withdrawn from the published devices until they recover, since the API server lacks device taints: %s", len(gone), strings.Join(gone, "; ")),
		})
	}
}

// Fallbacks implements [preparer.FallbackProvider].
func (p *Publisher) Fallbacks() []preparer.Fallback {
	return []preparer.Fallback{{
		Feature: "DRADeviceTaints", On: &p.taints,
		Log:    "The API server lacks device taints (DRADeviceTaints): unhealthy GPUs are withdrawn from the ResourceSlices until they recover, instead of tainted",
		Reason: "DeviceTaintsUnavailable",
		Event:  "The API server dropped the device taints of unhealthy GPUs (DRADeviceTaints off): gpudra withdraws unhealthy GPUs from the ResourceSlices until they recover",
	}}
}
