package chaos

import (
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// The checker must find what it is for: each case breaks one invariant
// on an otherwise sound node and expects its violation.

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	uidA = "00000000-0000-0000-0000-00000000000a"
	uidB = "00000000-0000-0000-0000-00000000000b"
)

func counterSet(value int64) []resourceapi.DeviceCounterConsumption {
	return []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters", Counters: map[string]resourceapi.Counter{
		"memory": {Value: *resource.NewQuantity(value, resource.DecimalSI)},
	}}}
}

// soundNode is a node with one prepared claim (uidA) holding gpu-0 with
// a time slice, and nothing else.
func soundNode() (*observed, liveClaims) {
	minor := int64(0)
	o := &observed{
		claims: map[string]*ckptClaim{uidA: {
			UID: uidA, Phase: "PrepareCompleted",
			Devices: []ckptDevice{{Name: "gpu-0", UUID: gpuA}},
			Records: map[string]json.RawMessage{"timeSlicing": json.RawMessage(`{"gpus":[{"device":"gpu-0","gpu":"` + gpuA + `","interval":"Long"}]}`)},
		}},
		specs: map[string]*spec{uidA: {
			content: cdi.SpecContent{DeviceNames: []string{"gpu-0"}, Devices: []cdi.DeviceIdentity{{Name: "gpu-0", UUID: gpuA}}},
			raw: &cdispec.Spec{Devices: []cdispec.Device{{
				Name:           uidA + "-gpu-0",
				ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", Minor: 0}}},
			}}},
		}},
		nvml:    &sim.State{GPUs: map[string]sim.GPUState{gpuA: {}}},
		sysfs:   &fakesysfs.State{Functions: map[string]fakesysfs.FunctionState{"0000:1b:00.0": {Driver: "nvidia", VFIODev: -1}}},
		slices:  map[string]v1beta1.TimeSliceInterval{gpuA: v1beta1.LongTimeSlice},
		daemons: map[string][]int{},
		devices: map[string]*published{
			"gpu-0": {
				attrs:    map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("gpu")}, "minor": {IntValue: &minor}},
				consumes: counterSet(8),
			},
			"gpu-vfio-0":                 {attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("vfio")}}, consumes: counterSet(8)},
			"gpu-0-mig-1g10gb-19-0":      {attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("mig")}}, consumes: counterSet(1)},
			"gpu-0-mig-7g80gb-0-0":       {attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("mig")}}, consumes: counterSet(8)},
			"gpu-0-mig-1g10gb-19-1-fake": {consumes: counterSet(1)},
		},
		sets: map[string]map[string]int64{"gpu-0-counters": {"memory": 8}},
	}
	claimObj := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: uidA}}
	claimObj.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driverName, Pool: nodeName, Device: "gpu-0"}}}}
	live := liveClaims{uidA: {obj: claimObj, kind: kindTimeSliced, phase: phasePrepared, cdiIDs: []string{cdi.Kind(driverName) + "=" + uidA + "-gpu-0"}}}
	return o, live
}

func TestCheckFindsViolations(t *testing.T) {
	o, live := soundNode()
	if v := o.check(live, false); len(v) > 0 {
		t.Fatalf("sound node: %v", v)
	}
	// While the checkpoint is lost, the specs say what is prepared.
	lost, lostLive := soundNode()
	lost.lost, lost.claims = "adoption pending", map[string]*ckptClaim{}
	if v := lost.check(lostLive, false); len(v) > 0 {
		t.Fatalf("sound node with its checkpoint lost: %v", v)
	}
	migRecord := json.RawMessage(`{"devices":[{"device":"gpu-0-mig-1g10gb-19-3","parentUUID":"` + gpuA + `","profile":"1g.10gb","start":3,"size":1,"uuid":"MIG-x"}]}`)
	for name, tc := range map[string]struct {
		breakIt func(o *observed, live liveClaims)
		final   bool
		want    string
	}{
		"a device in two claims": {func(o *observed, _ liveClaims) {
			o.claims[uidB] = &ckptClaim{UID: uidB, Phase: "PrepareStarted", Devices: []ckptDevice{{Name: "gpu-0"}}}
		}, false, "exclusive: checkpoint: device gpu-0 held by claims"},
		"a GPU and its VFIO device in two specs": {func(o *observed, live liveClaims) {
			o.specs[uidB] = &spec{content: cdi.SpecContent{DeviceNames: []string{"gpu-vfio-0"}}, raw: &cdispec.Spec{}}
			live[uidB] = &claim{obj: &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "b", UID: uidB}}, phase: phaseAllocated}
		}, false, "exclusive: CDI specs: counter gpu-0-counters/memory used 16 times"},
		"a MIG device next to the whole GPU": {func(o *observed, _ liveClaims) {
			o.claims[uidB] = &ckptClaim{UID: uidB, Phase: "PrepareStarted", Devices: []ckptDevice{{Name: "gpu-0-mig-1g10gb-19-0"}}}
		}, false, "exclusive: checkpoint: counter gpu-0-counters/memory used 9"},
		"a GPU whole in two claims under two names": {func(o *observed, _ liveClaims) {
			o.claims[uidB] = &ckptClaim{UID: uidB, Phase: "PrepareCompleted", Devices: []ckptDevice{{Name: "gpu-other-name", UUID: gpuA}}}
		}, false, "exclusive: checkpoint: " + gpuA + " prepared for claims"},
		"a MIG instance owned by two claims": {func(o *observed, _ liveClaims) {
			o.claims[uidA].Records["dynamicMIG"] = migRecord
			o.claims[uidB] = &ckptClaim{UID: uidB, Phase: "PrepareCompleted", Records: map[string]json.RawMessage{"dynamicMIG": migRecord}}
		}, false, "exclusive: checkpoint: MIG instance " + gpuA + " 1g.10gb@3 owned by claims"},
		"a MIG instance in two claims' specs": {func(o *observed, live liveClaims) {
			o.specs[uidB] = &spec{content: cdi.SpecContent{Records: map[string]json.RawMessage{"dynamicMIG": migRecord}}, raw: &cdispec.Spec{}}
			o.specs[uidA].content.Records = map[string]json.RawMessage{"dynamicMIG": migRecord}
		}, false, "exclusive: CDI specs: MIG instance " + gpuA + " 1g.10gb@3 owned by claims"},
		"a spec naming a MIG device that is gone": {func(o *observed, _ liveClaims) {
			c := &o.specs[uidA].content
			c.DeviceNames = append(c.DeviceNames, "gpu-0-mig-1g10gb-19-0")
			c.Devices = append(c.Devices, cdi.DeviceIdentity{Name: "gpu-0-mig-1g10gb-19-0", UUID: "MIG-gone", ParentUUID: gpuA})
		}, false, "exists: claim " + uidA + ": its CDI spec names MIG device gpu-0-mig-1g10gb-19-0 (MIG-gone"},
		"a spec naming a device that is not published": {func(o *observed, _ liveClaims) {
			o.specs[uidA].content.DeviceNames = append(o.specs[uidA].content.DeviceNames, "gpu-9")
		}, false, "exists: claim " + uidA + ": its CDI spec names device gpu-9, which is not published"},
		"a prepared claim without its spec while the checkpoint is lost": {func(o *observed, _ liveClaims) {
			o.lost, o.claims = "adoption pending", map[string]*ckptClaim{}
			delete(o.specs, uidA)
		}, false, "intact: claim a (time-sliced): prepared, but it has no CDI spec (checkpoint lost"},
		"a checkpoint entry of a gone claim": {func(o *observed, _ liveClaims) {
			o.claims[uidB] = &ckptClaim{UID: uidB, Phase: "PrepareStarted"}
		}, false, "owned: checkpoint entry " + uidB},
		"a spec of a gone claim": {func(o *observed, _ liveClaims) {
			o.specs[uidB] = &spec{raw: &cdispec.Spec{}}
		}, false, "owned: CDI spec for claim " + uidB},
		"a MIG instance nobody owns": {func(o *observed, _ liveClaims) {
			o.nvml.GPUs[gpuA] = sim.GPUState{GPUInstances: []sim.GPUInstanceState{{Profile: "1g.10gb", Start: 3, ComputeInstances: []sim.ComputeInstanceState{{UUID: "MIG-x"}}}}}
		}, false, "owned: MIG instance 1g.10gb at 3"},
		"a GPU left on vfio-pci": {func(o *observed, _ liveClaims) {
			o.sysfs.Functions["0000:1b:00.0"] = fakesysfs.FunctionState{Driver: "vfio-pci", Override: "vfio-pci", VFIODev: 0}
		}, false, "owned: PCI function 0000:1b:00.0 bound to \"vfio-pci\""},
		"a time slice nobody holds": {func(o *observed, _ liveClaims) {
			o.slices["GPU-other"] = v1beta1.ShortTimeSlice
		}, false, "owned: GPU GPU-other time slice Short"},
		"an MPS daemon nobody owns": {func(o *observed, _ liveClaims) {
			o.daemons[uidB] = []int{42}
		}, false, "owned: MPS daemon " + uidB},
		"a prepared claim without its spec": {func(o *observed, _ liveClaims) {
			delete(o.specs, uidA)
		}, false, "intact: claim a (time-sliced): prepared, but it has no CDI spec"},
		"a prepared claim whose record is only started": {func(o *observed, _ liveClaims) {
			o.claims[uidA].Phase = "PrepareStarted"
		}, false, "intact: claim a (time-sliced): prepared, but the checkpoint has"},
		"a prepared claim whose time slice went": {func(o *observed, _ liveClaims) {
			o.slices[gpuA] = v1beta1.DefaultTimeSlice
		}, false, "time slice \"Default\", the claim holds Long"},
		"a spec without the GPU's node": {func(o *observed, _ liveClaims) {
			o.specs[uidA].raw.Devices[0].ContainerEdits.DeviceNodes = nil
		}, false, "spec lacks /dev/nvidia0"},
		"anything left at the end": {func(_ *observed, live liveClaims) {
			delete(live, types.UID(uidA))
		}, true, "clean: checkpoint still holds 1 claims"},
	} {
		t.Run(name, func(t *testing.T) {
			o, live := soundNode()
			tc.breakIt(o, live)
			v := o.check(live, tc.final)
			if !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("violations %q, want one with %q", v, tc.want)
			}
		})
	}
}
