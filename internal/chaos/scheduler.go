package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/allocation"
)

// kind is a kind of claim the harness makes.
type kind string

// The kinds of claims. Which a node offers depends on its profile.
const (
	kindFull        kind = "full-gpu"     // one whole GPU
	kindFullPair    kind = "two-gpus"     // two whole GPUs in one claim
	kindMIG         kind = "dynamic-mig"  // one MIG device of a random profile
	kindMIGMPS      kind = "mig-mps"      // a MIG device with an MPS daemon
	kindTimeSliced  kind = "time-sliced"  // a GPU (or uncapped share) with a time slice
	kindMPS         kind = "mps"          // a GPU (or uncapped share) with an MPS daemon
	kindShare       kind = "share"        // a share capped in memory: an MPS daemon with its caps
	kindShareNoCaps kind = "share-nocaps" // a share that asks for nothing
	kindVFIO        kind = "vfio"         // a GPU for passthrough
	kindGPUAndMIG   kind = "gpu+mig"      // a whole GPU and a MIG device in one claim
)

// kindsOf are the claim kinds a node of the profile offers.
func kindsOf(p profile) []kind {
	if p == profileShared {
		return []kind{kindShare, kindShareNoCaps, kindTimeSliced, kindMPS, kindMIG, kindMIGMPS, kindVFIO}
	}
	return []kind{kindFull, kindFullPair, kindMIG, kindMIGMPS, kindTimeSliced, kindMPS, kindVFIO, kindGPUAndMIG}
}

var timeSliceIntervals = []string{"Default", "Short", "Medium", "Long"}

// opaque is an opaque config of gpudra for some requests.
func opaque(params string, requests ...string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func request(name, class string, count int64, selectors ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return r
}

func migRequest(name, migProfile string) resourceapi.DeviceRequest {
	return request(name, deviceclasses.MIG, 1, fmt.Sprintf("device.attributes['gpu.nvidia.com'].profile == %q", migProfile))
}

// claimSpec makes the spec of a claim of kind k, as a user would write it.
func claimSpec(k kind, rng *rand.Rand, migProfiles []string) resourceapi.ResourceClaimSpec {
	var spec resourceapi.ResourceClaimSpec
	d := &spec.Devices
	migProfile := migProfiles[rng.IntN(len(migProfiles))]
	switch k {
	case kindFull, kindShareNoCaps:
		d.Requests = []resourceapi.DeviceRequest{request("gpu", deviceclasses.GPU, 1)}
	case kindFullPair:
		d.Requests = []resourceapi.DeviceRequest{request("gpus", deviceclasses.GPU, 2)}
	case kindMIG:
		d.Requests = []resourceapi.DeviceRequest{migRequest("mig", migProfile)}
	case kindMIGMPS:
		d.Requests = []resourceapi.DeviceRequest{migRequest("mig", migProfile)}
		d.Config = []resourceapi.DeviceClaimConfiguration{opaque(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`, "mig")}
	case kindTimeSliced:
		d.Requests = []resourceapi.DeviceRequest{request("gpu", deviceclasses.GPU, 1)}
		interval := timeSliceIntervals[rng.IntN(len(timeSliceIntervals))]
		d.Config = []resourceapi.DeviceClaimConfiguration{opaque(fmt.Sprintf(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":%q}}}`, interval), "gpu")}
	case kindMPS:
		d.Requests = []resourceapi.DeviceRequest{request("gpu", deviceclasses.GPU, 1)}
		d.Config = []resourceapi.DeviceClaimConfiguration{opaque(fmt.Sprintf(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":%d}}}`, 10+rng.IntN(90)), "gpu")}
	case kindShare:
		r := request("gpu", deviceclasses.GPU, 1)
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(fmt.Sprintf("%dGi", []int{5, 10, 20, 40}[rng.IntN(4)])),
		}}
		d.Requests = []resourceapi.DeviceRequest{r}
	case kindVFIO:
		d.Requests = []resourceapi.DeviceRequest{request("vm", deviceclasses.VFIO, 1)}
	case kindGPUAndMIG:
		d.Requests = []resourceapi.DeviceRequest{request("gpu", deviceclasses.GPU, 1), migRequest("mig", migProfile)}
	default:
		panic(fmt.Sprintf("chaos: unknown claim kind %q", k))
	}
	return spec
}

// scheduler allocates claims from the node's published slices with the
// scheduler's own allocator (k8s.io/dynamic-resource-allocation/structured),
// as kube-scheduler does, knowing every allocation it made that is not
// yet released.
type scheduler struct {
	client  kubeClient
	classes allocation.Classes
	cel     *cel.Cache
	live    map[types.UID]*resourceapi.AllocationResult
	// slices are the published slices, listed again after refresh.
	slices []*resourceapi.ResourceSlice
}

// refresh makes the next allocation list the published slices again.
func (s *scheduler) refresh() { s.slices = nil }

// kubeClient is the part of the clientset the harness needs.
type kubeClient interface {
	listSlices(ctx context.Context) ([]*resourceapi.ResourceSlice, error)
}

func newScheduler(client kubeClient) (*scheduler, error) {
	classes, err := deviceclasses.All()
	if err != nil {
		return nil, err
	}
	return &scheduler{client: client, classes: classes, cel: cel.NewCache(100, cel.Features{}), live: map[types.UID]*resourceapi.AllocationResult{}}, nil
}

// allocate allocates the claim and remembers the result as live; nil
// when it does not fit.
func (s *scheduler) allocate(ctx context.Context, claim *resourceapi.ResourceClaim) (*resourceapi.AllocationResult, error) {
	if s.slices == nil {
		published, err := s.client.listSlices(ctx)
		if err != nil {
			return nil, err
		}
		s.slices = published
	}
	live := make([]*resourceapi.AllocationResult, 0, len(s.live))
	for _, uid := range slices.Sorted(maps.Keys(s.live)) {
		live = append(live, s.live[uid])
	}
	result, err := allocation.Allocate(ctx, allocation.Features, s.classes, s.cel, s.slices, live, nodeName, claim)
	if err != nil || result == nil {
		return nil, err
	}
	s.live[claim.UID] = result
	return result, nil
}

// release forgets an allocation: the claim was unprepared.
func (s *scheduler) release(uid types.UID) { delete(s.live, uid) }

// migProfiles returns the MIG profiles the slices publish, sorted.
func migProfiles(published []*resourceapi.ResourceSlice) []string {
	seen := sets.New[string]()
	for _, sl := range published {
		for _, d := range sl.Spec.Devices {
			if a, ok := d.Attributes["profile"]; ok && a.StringValue != nil {
				seen.Insert(*a.StringValue)
			}
		}
	}
	return sets.List(seen)
}
