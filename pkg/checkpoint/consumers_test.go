package checkpoint

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// TestPodGroupConsumer: a claim reserved for a PodGroup (KEP-5729) records
// the consumer with its kind, in optional fields that a pod leaves out, so
// that files written before read the same and a pod's entry keeps its
// bytes.
func TestPodGroupConsumer(t *testing.T) {
	c := testClaim("u")
	c.Consumers = []claimstate.Consumer{
		claimstate.NewConsumer(claimstate.PodGroupAPIGroup, claimstate.PodGroupResource, "trainers", "pg-uid"),
		claimstate.NewConsumer("", "pods", "trainer-0", "pod-uid"),
	}
	st := &claimstate.State{Claims: map[string]*claimstate.Claim{"u": c}}
	data, err := encode("boot-x", st)
	if err != nil {
		t.Fatal(err)
	}
	want := `"consumers":[{"apiGroup":"scheduling.k8s.io","resource":"podgroups","name":"trainers","uid":"pg-uid"},{"name":"trainer-0","uid":"pod-uid"}]`
	if !strings.Contains(string(data), want) {
		t.Errorf("encoded\n%s\nwant it to hold\n%s", data, want)
	}
	d, err := testSchema.decode(data)
	if err != nil {
		t.Fatal(err)
	}
	got := d.state.Claims["u"].Consumers
	if !reflect.DeepEqual(got, c.Consumers) {
		t.Errorf("decoded consumers = %+v, want %+v", got, c.Consumers)
	}
	if !got[0].IsPodGroup() || got[0].IsPod() || !got[1].IsPod() || got[1].IsPodGroup() {
		t.Errorf("kinds read back: %s %s, want PodGroup pod", got[0].Kind(), got[1].Kind())
	}
}

// TestNVIDIAPodGroupConsumer: NVIDIA's checkpoint keeps the claim's whole
// status; a PodGroup in its reservedFor is adopted as a consumer too.
func TestNVIDIAPodGroupConsumer(t *testing.T) {
	var v2 nvSectionV2
	if err := json.Unmarshal([]byte(`{"preparedClaims":{"c1":{"checkpointState":"PrepareCompleted","status":{"reservedFor":[`+
		`{"apiGroup":"scheduling.k8s.io","resource":"podgroups","name":"trainers","uid":"pg-uid"},`+
		`{"resource":"pods","name":"p","uid":"pod-uid"}]},"preparedDevices":[]}}}`), &v2); err != nil {
		t.Fatal(err)
	}
	f, _, err := testSchema.fromNVIDIAv2(&v2)
	if err != nil {
		t.Fatal(err)
	}
	want := []consumerV5{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg-uid"}, {Name: "p", UID: "pod-uid"}}
	if got := f.Claims["c1"].Consumers; !reflect.DeepEqual(got, want) {
		t.Errorf("consumers = %+v, want %+v", got, want)
	}
}
