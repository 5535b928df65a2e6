package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// TestIncrementalEncodeMatchesFullEncode: over a long run of random changes
// (claims added, removed and changed in every field, records that switch
// the file between v2 and v5, strings JSON escapes), the encoder that keeps
// unchanged claims' JSON writes exactly what a full encode writes.
func TestIncrementalEncodeMatchesFullEncode(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 2026))
	var enc claimEncoder
	st := benchState()
	for step := range 2000 {
		next := st.Clone()
		for range 1 + rng.IntN(3) {
			mutateState(rng, next)
		}
		want, err := encode("boot-<&>", next)
		if err != nil {
			t.Fatal(err)
		}
		got, err := enc.encode("boot-<&>", next)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("step %d: incremental encoding\n%s\ndiffers from a full encode\n%s", step, got, want)
		}
		st = next
	}
	if len(enc.claims) != len(st.Claims) {
		t.Errorf("encoder keeps %d claims, the state has %d: removed claims are kept", len(enc.claims), len(st.Claims))
	}
}

// mutateState makes one random change to st.
func mutateState(rng *rand.Rand, st *claimstate.State) {
	uids := slices.Sorted(func(yield func(string) bool) {
		for uid := range st.Claims {
			if !yield(uid) {
				return
			}
		}
	})
	pick := func() *claimstate.Claim {
		if len(uids) == 0 {
			return nil
		}
		return st.Claims[uids[rng.IntN(len(uids))]]
	}
	word := func() string {
		return []string{"", "a", "<b>", "gpu-1", "ü&", `q"`, "MIG-1", "0abc"}[rng.IntN(8)]
	}
	c := pick()
	switch op := rng.IntN(12); {
	case op == 0 || c == nil:
		uid := fmt.Sprintf("uid-%d<&>", rng.IntN(40))
		st.Claims[uid] = &claimstate.Claim{UID: uid, Namespace: word(), Name: word(), Phase: claimstate.PrepareStarted,
			Devices: []claimstate.Device{{Requests: []string{word()}, Pool: "p", Name: word()}}}
	case op == 1:
		delete(st.Claims, c.UID)
	case op == 2:
		c.Phase = []claimstate.Phase{claimstate.PrepareStarted, claimstate.PrepareCompleted}[rng.IntN(2)]
	case op == 3:
		zones := []*time.Location{time.UTC, time.FixedZone("X", 3600), time.Local}
		c.StartedAt = time.Date(2026, 11, 28, rng.IntN(24), 0, 0, rng.IntN(3), zones[rng.IntN(3)])
	case op == 4:
		c.Consumers = append(c.Consumers, claimstate.Consumer{Name: word(), UID: word()})
	case op == 5:
		c.Consumers = nil
	case op == 6 && len(c.Devices) > 0:
		d := &c.Devices[rng.IntN(len(c.Devices))]
		switch rng.IntN(6) {
		case 0:
			d.UUID = word()
		case 1:
			d.ShareID, d.ParentUUID = word(), word()
		case 2:
			d.AdminAccess = !d.AdminAccess
		case 3:
			d.Requests = [][]string{nil, {}, {word()}, {word(), word()}}[rng.IntN(4)]
		case 4:
			d.CDIDeviceIDs = [][]string{nil, {}, {word()}}[rng.IntN(3)]
		case 5:
			d.Name, d.Pool = word(), word()
		}
	case op == 7:
		c.Devices = append(c.Devices, claimstate.Device{Requests: []string{word()}, Pool: "p", Name: word()})
	case op == 8:
		c.Adopted = !c.Adopted
	case op == 9:
		name := testRecords[rng.IntN(len(testRecords))]
		if c.Records == nil {
			c.Records = map[string]json.RawMessage{}
		}
		text, _ := json.Marshal("<" + word() + ">")
		c.Records[name] = json.RawMessage(fmt.Sprintf(`{"n":%d,"s":%s}`, rng.IntN(5), text))
	case op == 10:
		c.Records = nil
	case op == 11:
		c.Namespace, c.Name = word(), word()
	}
}

// TestSameOnWireSeesEveryField: every field of a claim, its consumers and
// devices, set to values that change the file, makes sameOnWire say the
// claim changed. Fields are found by reflection, so a field added to
// claimstate without a comparison in sameOnWire fails here.
func TestSameOnWireSeesEveryField(t *testing.T) {
	base := benchState().Claims["6f1c2d3e-4a5b-4c6d-8e7f-000000000001"]
	base.Adopted = true
	base.Records = map[string]json.RawMessage{"example": json.RawMessage(`{"a":1}`)}
	base.Devices[0].ShareID = "share-1"
	seen := 0
	for _, v := range variants(t, reflect.ValueOf(base).Elem(), "Claim") {
		changed := base.Clone()
		v.apply(reflect.ValueOf(changed).Elem())
		a, err := encodeClaim(base.UID, base)
		if err != nil {
			t.Fatal(err)
		}
		b, err := encodeClaim(changed.UID, changed)
		if err != nil {
			// A claim the file cannot hold (an unknown phase): validate
			// refuses it before it is encoded.
			continue
		}
		if bytes.Equal(a.data, b.data) {
			continue
		}
		seen++
		if sameOnWire(base, changed) {
			t.Errorf("%s changed the claim's JSON, but sameOnWire says the claims are the same", v.path)
		}
	}
	if seen < 20 {
		t.Errorf("only %d changes changed the JSON: the variants do not reach every field", seen)
	}
	if !sameOnWire(base, base.Clone()) {
		t.Error("a claim and its clone are not the same on the wire")
	}
}

// variant is one change to a value, by its path from the claim.
type variant struct {
	path  string
	apply func(claim reflect.Value)
}

// variants returns changes of every field below v (a claim, or a value
// within it), each applied through the path from the claim to the field.
func variants(t *testing.T, v reflect.Value, path string) []variant {
	t.Helper()
	at := func(sub string, get func(reflect.Value) reflect.Value, vs []variant) []variant {
		out := make([]variant, len(vs))
		for i, inner := range vs {
			out[i] = variant{path: path + sub + inner.path, apply: func(c reflect.Value) { inner.apply(get(c)) }}
		}
		return out
	}
	set := func(name string, values ...any) []variant {
		var out []variant
		for i, x := range values {
			out = append(out, variant{path: fmt.Sprintf("=%s#%d", name, i), apply: func(f reflect.Value) {
				if x == nil {
					f.SetZero()
					return
				}
				f.Set(reflect.ValueOf(x).Convert(f.Type()))
			}})
		}
		return out
	}
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		tm := v.Interface().(time.Time)
		return set("time", tm.Add(time.Nanosecond), tm.In(time.FixedZone("X", 3600)), time.Time{})
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		return set("raw", json.RawMessage(`{"a":2}`), json.RawMessage(`[]`))
	}
	switch v.Kind() {
	case reflect.String:
		return set("string", "", v.String()+"x", "<changed>")
	case reflect.Bool:
		return set("bool", !v.Bool())
	case reflect.Struct:
		var out []variant
		for i := range v.NumField() {
			i := i
			out = append(out, at("."+v.Type().Field(i).Name, func(x reflect.Value) reflect.Value { return x.Field(i) }, variants(t, v.Field(i), ""))...)
		}
		return out
	case reflect.Slice:
		out := []variant{
			{path: "=nil", apply: func(f reflect.Value) { f.SetZero() }},
			{path: "=empty", apply: func(f reflect.Value) { f.Set(reflect.MakeSlice(f.Type(), 0, 0)) }},
			{path: "+1", apply: func(f reflect.Value) {
				if f.Len() > 0 {
					f.Set(reflect.Append(f, f.Index(0)))
				} else {
					f.Set(reflect.Append(f, reflect.Zero(f.Type().Elem())))
				}
			}},
		}
		if v.Len() > 0 {
			out = append(out, at("[0]", func(x reflect.Value) reflect.Value { return x.Index(0) }, variants(t, v.Index(0), ""))...)
		}
		return out
	case reflect.Map:
		out := []variant{
			{path: "=nil", apply: func(f reflect.Value) { f.SetZero() }},
			{path: "=empty", apply: func(f reflect.Value) { f.Set(reflect.MakeMap(f.Type())) }},
		}
		for _, k := range v.MapKeys() {
			for _, inner := range variants(t, v.MapIndex(k), "") {
				out = append(out, variant{path: fmt.Sprintf("[%v]%s", k, inner.path), apply: func(f reflect.Value) {
					// Map elements are not addressable: change a copy, put it back.
					e := reflect.New(f.Type().Elem()).Elem()
					e.Set(f.MapIndex(k))
					inner.apply(e)
					f.SetMapIndex(k, e)
				}})
			}
			out = append(out, variant{path: "[extra]", apply: func(f reflect.Value) {
				f.SetMapIndex(reflect.ValueOf("extra").Convert(f.Type().Key()), f.MapIndex(k))
			}})
		}
		return out
	}
	t.Fatalf("%s: a field of kind %s, which this test cannot change: teach it, and sameOnWire", path, v.Kind())
	return nil
}

// TestStoreFileIsFullEncodeAfterManyUpdates: through the Store, after many
// Updates that each change one claim, the file holds exactly what a full
// encode of the state gives.
func TestStoreFileIsFullEncodeAfterManyUpdates(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 16))
	for i := range 200 {
		err := s.Update(ctx, func(st *claimstate.State) error {
			if i == 0 {
				for uid, c := range benchState().Claims {
					st.Claims[uid] = c
				}
			}
			mutateState(rng, st)
			return nil
		})
		if err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		st, err := s.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want, err := encode("boot-a", st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(e.path())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("update %d: the file\n%s\nis not a full encode of the state\n%s", i, got, want)
		}
	}
}
