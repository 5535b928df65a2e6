package claimstate_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// fullState has every field of every type set, so that a shallow copy
// anywhere shows.
func fullState() *claimstate.State {
	return stateOf(
		&claimstate.Claim{
			UID: "a", Namespace: "ns", Name: "claim-a", Phase: claimstate.PrepareCompleted, StartedAt: t0,
			Consumers: []claimstate.Consumer{{Name: "pod-1", UID: "pod-uid-1"}, {Name: "pod-2", UID: "pod-uid-2"}},
			Devices: []claimstate.Device{
				{
					Requests: []string{"gpu", "gpu/small"}, Pool: pool, Name: "gpu-0-mig-1g10gb-19-0", ShareID: "s1", AdminAccess: true,
					UUID: "MIG-1", ParentUUID: "GPU-1", CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=a-gpu-0-mig-1g10gb-19-0", "extra"},
				},
				{Requests: []string{"other"}, Pool: pool, Name: "gpu-1", UUID: "GPU-2"},
			},
		},
		claim("b", claimstate.PrepareStarted, dev("gpu-2")),
		// No consumers, no devices: nil slices must survive too.
		&claimstate.Claim{UID: "c", Phase: claimstate.PrepareStarted},
	)
}

func TestStateCloneIsDeep(t *testing.T) {
	mutations := map[string]func(*claimstate.State){
		"claim phase":       func(s *claimstate.State) { s.Claims["a"].Phase = claimstate.PrepareStarted },
		"claim started at":  func(s *claimstate.State) { s.Claims["a"].StartedAt = s.Claims["a"].StartedAt.Add(1) },
		"consumer":          func(s *claimstate.State) { s.Claims["a"].Consumers[1].UID = "x" },
		"consumers append":  func(s *claimstate.State) { appendIntoCapacity(&s.Claims["a"].Consumers) },
		"device name":       func(s *claimstate.State) { s.Claims["a"].Devices[0].Name = "x" },
		"device request":    func(s *claimstate.State) { s.Claims["a"].Devices[0].Requests[1] = "x" },
		"device CDI ID":     func(s *claimstate.State) { s.Claims["a"].Devices[0].CDIDeviceIDs[0] = "x" },
		"devices append":    func(s *claimstate.State) { s.Claims["b"].Devices = append(s.Claims["b"].Devices[:0], dev("x")) },
		"nil devices":       func(s *claimstate.State) { s.Claims["c"].Devices = append(s.Claims["c"].Devices, dev("x")) },
		"remove claim":      func(s *claimstate.State) { s.Remove("b") },
		"add claim":         func(s *claimstate.State) { s.Claims["d"] = claim("d", claimstate.PrepareStarted) },
		"replace claim":     func(s *claimstate.State) { s.Claims["a"] = claim("a", claimstate.PrepareStarted) },
		"record on a clone": func(s *claimstate.State) { _ = s.RecordStarted(intent("e", dev("gpu-9")), t0) },
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			orig := fullState()
			clone := orig.Clone()
			if !same(clone, orig) {
				t.Fatalf("clone differs from the original:\n%s\n%s", dump(clone), dump(orig))
			}
			mutate(clone)
			if same(clone, orig) {
				t.Fatal("mutation did not change the clone; the test is broken")
			}
			if !same(orig, fullState()) {
				t.Error("mutating the clone changed the original")
			}
			// And the other way round.
			orig2 := fullState()
			clone2 := orig2.Clone()
			mutate(orig2)
			if !same(clone2, fullState()) {
				t.Error("mutating the original changed the clone")
			}
		})
	}
}

// appendIntoCapacity appends within the slice's capacity, which is how a
// shallow copy gets overwritten without any index being shared.
func appendIntoCapacity(cs *[]claimstate.Consumer) {
	s := (*cs)[:1]
	*cs = append(s, claimstate.Consumer{Name: "x"})
}

func TestCloneEmpty(t *testing.T) {
	s := claimstate.New()
	c := s.Clone()
	if c.Claims == nil || len(c.Claims) != 0 {
		t.Fatalf("clone of an empty state: %+v", c)
	}
	c.Claims["a"] = claim("a", claimstate.PrepareStarted)
	if len(s.Claims) != 0 {
		t.Error("adding to the clone of an empty state changed the original")
	}
}

// same compares states by content. Clone turns a nil device list into an
// empty one, which means the same; everything else must be equal.
func same(a, b *claimstate.State) bool {
	return reflect.DeepEqual(normalized(a), normalized(b))
}

// normalized copies s by hand (not with Clone, which is under test),
// with empty lists as nil.
func normalized(s *claimstate.State) map[string]claimstate.Claim {
	out := map[string]claimstate.Claim{}
	for uid, c := range s.Claims {
		n := *c
		n.Consumers, n.Devices = nil, nil
		n.Consumers = append(n.Consumers, c.Consumers...)
		for _, d := range c.Devices {
			d.Requests = append([]string(nil), d.Requests...)
			d.CDIDeviceIDs = append([]string(nil), d.CDIDeviceIDs...)
			n.Devices = append(n.Devices, d)
		}
		out[uid] = n
	}
	return out
}

func dump(s *claimstate.State) string {
	b, _ := json.Marshal(s)
	return string(b)
}
