package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// The harness is the kubelet: it calls the plugin's DRA gRPC service as
// the kubelet's DRA manager does, several claims (a pod's) per call,
// several calls at once, each bounded by the kubelet's call timeout, and
// retries what failed.

// phase is where a claim is, as the kubelet sees it.
type phase int

const (
	// phaseAllocated: allocated to the node; Prepare is due (again).
	phaseAllocated phase = iota
	// phasePrepared: Prepare succeeded; its pod runs.
	phasePrepared
	// phaseReleasing: the pod is gone or the kubelet gave up on it;
	// Unprepare is due (again).
	phaseReleasing
)

// claim is one claim the harness made.
type claim struct {
	obj      *resourceapi.ResourceClaim // with its allocation
	kind     kind
	phase    phase
	failures int      // failed Prepares in a row
	cdiIDs   []string // what the successful Prepare returned, sorted
	// forced: the claim and its pod were deleted from the API server
	// before the claim was unprepared (a forced deletion); the scheduler
	// has already handed its devices out again.
	forced bool
}

// outcome is what one call said about one claim.
type outcome struct {
	transport error  // the call did not reach an answer (the plugin died, the call timed out)
	err       string // the claim's error, or the call's when the plugin failed it as a whole
	// whole: err is the call's (the kubeletplugin helper fails a call as
	// a whole when it cannot get a claim from the API server).
	whole   bool
	cdiIDs  []string // Prepare: the claim's CDI device IDs, sorted
	devices []*drapb.Device
}

func pbClaims(cs []*claim) []*drapb.Claim {
	out := make([]*drapb.Claim, len(cs))
	for i, c := range cs {
		out[i] = &drapb.Claim{Namespace: c.obj.Namespace, Name: c.obj.Name, Uid: string(c.obj.UID)}
	}
	return out
}

// prepare makes one NodePrepareResources call through dra (the client
// of the plugin process that runs when the call goes out).
func prepare(ctx context.Context, dra drapb.DRAPluginClient, timeout time.Duration, cs []*claim) map[types.UID]outcome {
	out := make(map[types.UID]outcome, len(cs))
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := dra.NodePrepareResources(callCtx, &drapb.NodePrepareResourcesRequest{Claims: pbClaims(cs)})
	for _, c := range cs {
		switch {
		case err != nil:
			out[c.obj.UID] = callFailed(err)
		case resp.Claims[string(c.obj.UID)] == nil:
			out[c.obj.UID] = outcome{err: "no result for the claim"}
		case resp.Claims[string(c.obj.UID)].Error != "":
			out[c.obj.UID] = outcome{err: resp.Claims[string(c.obj.UID)].Error}
		default:
			r := resp.Claims[string(c.obj.UID)]
			o := outcome{devices: r.Devices}
			for _, d := range r.Devices {
				o.cdiIDs = append(o.cdiIDs, d.CdiDeviceIds...)
			}
			slices.Sort(o.cdiIDs)
			out[c.obj.UID] = o
		}
	}
	return out
}

// unprepare makes one NodeUnprepareResources call through dra.
func unprepare(ctx context.Context, dra drapb.DRAPluginClient, timeout time.Duration, cs []*claim) map[types.UID]outcome {
	out := make(map[types.UID]outcome, len(cs))
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := dra.NodeUnprepareResources(callCtx, &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims(cs)})
	for _, c := range cs {
		switch {
		case err != nil:
			out[c.obj.UID] = callFailed(err)
		case resp.Claims[string(c.obj.UID)] == nil:
			out[c.obj.UID] = outcome{err: "no result for the claim"}
		default:
			out[c.obj.UID] = outcome{err: resp.Claims[string(c.obj.UID)].Error}
		}
	}
	return out
}

// callFailed is the outcome of a call that failed as a whole: the plugin
// is gone or did not answer in time (transport), or it answered with an
// error for the whole call (the kubeletplugin helper does when it cannot
// get a claim from the API server), which counts as each claim's.
func callFailed(err error) outcome {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return outcome{transport: err}
	}
	return outcome{err: err.Error(), whole: true}
}

// resultMatches checks what a successful Prepare returned against the
// claim's allocation: every device of the allocation, each with a CDI
// device of the claim, nothing else.
func resultMatches(c *claim, o outcome) []string {
	var v []string
	want := map[string]bool{}
	for _, r := range c.obj.Status.Allocation.Devices.Results {
		want[r.Request+"/"+r.Pool+"/"+r.Device] = true
	}
	got := map[string]bool{}
	for _, d := range o.devices {
		for _, req := range d.RequestNames {
			key := req + "/" + d.PoolName + "/" + d.DeviceName
			got[key] = true
			if !want[key] {
				v = append(v, fmt.Sprintf("result: claim %s: Prepare returned %s, which is not allocated", c.obj.Name, key))
			}
		}
		if len(d.CdiDeviceIds) == 0 {
			v = append(v, fmt.Sprintf("result: claim %s: device %s without CDI devices", c.obj.Name, d.DeviceName))
		}
		for _, id := range d.CdiDeviceIds {
			if !strings.Contains(id, string(c.obj.UID)) {
				v = append(v, fmt.Sprintf("result: claim %s: CDI device %s is not named for the claim", c.obj.Name, id))
			}
		}
	}
	for key := range want {
		if !got[key] {
			v = append(v, fmt.Sprintf("result: claim %s: Prepare returned nothing for %s", c.obj.Name, key))
		}
	}
	return v
}

// String renders the outcome for traces.
func (o outcome) String() string {
	switch {
	case o.transport != nil:
		return "call failed: " + o.transport.Error()
	case o.err != "":
		return "error: " + o.err
	}
	return fmt.Sprintf("ok %v", o.cdiIDs)
}
