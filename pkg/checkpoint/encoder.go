package checkpoint

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// claimEncoder writes the file content [encode] writes, byte for byte, but
// keeps the JSON of every claim it encoded and encodes again only the
// claims that changed since: a commit changes one claim or a few, and
// encoding every claim of a busy node on every commit was most of the
// committer's CPU besides the write itself. It belongs to whoever commits
// (and to Open before the Store starts); it is not safe for concurrent
// use.
type claimEncoder struct {
	claims map[string]encodedClaim
	// size is the length of the last content encoded: the next is about
	// as long, and growing the buffer to it by doubling cost more than
	// the encoding of a claim.
	size int
	// spare is a buffer no one holds any more ([claimEncoder.recycle]),
	// which the next encode writes into: a commit's content is a few KiB,
	// the largest allocation of a Prepare.
	spare []byte
}

// recycle hands back content that encode returned, or that was read from
// the file, once nothing refers to it any more.
func (e *claimEncoder) recycle(data []byte) {
	if cap(data) > cap(e.spare) {
		e.spare = data[:0]
	}
}

// encodedClaim is one claim as last encoded.
type encodedClaim struct {
	// claim is a private copy of what data encodes, for the comparison.
	claim *claimstate.Claim
	// data is the claim's JSON: its key, a colon and its value.
	data []byte
}

// encode returns the file content for st, which must pass
// [schema.validate]: what encode(bootID, st) returns.
func (e *claimEncoder) encode(bootID string, st *claimstate.State) ([]byte, error) {
	// The object json.Marshal writes for a fileV5: fields in declaration
	// order, no spaces, map keys sorted, strings HTML-escaped.
	buf := bytes.NewBuffer(e.spare[:0])
	e.spare = nil
	buf.Grow(e.size + e.size/4)
	version := versionV2
	requires := requiredRecords(st)
	if len(requires) > 0 {
		version = versionV5
	}
	buf.WriteString(`{"version":`)
	writeJSON(buf, version)
	buf.WriteString(`,"bootID":`)
	writeJSON(buf, bootID)
	if len(requires) > 0 {
		buf.WriteString(`,"requires":`)
		writeJSON(buf, requires)
	}
	buf.WriteString(`,"claims":{`)
	next := make(map[string]encodedClaim, len(st.Claims))
	for i, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		c := st.Claims[uid]
		enc, ok := e.claims[uid]
		if !ok || !sameOnWire(enc.claim, c) {
			var err error
			if enc, err = encodeClaim(uid, c); err != nil {
				return nil, err
			}
		}
		next[uid] = enc
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(enc.data)
	}
	buf.WriteString("}}\n")
	e.claims = next
	e.size = buf.Len()
	return buf.Bytes(), nil
}

// encodeClaim encodes one claim as a member of the claims object.
func encodeClaim(uid string, c *claimstate.Claim) (encodedClaim, error) {
	w, err := claimToV5(uid, c)
	if err != nil {
		return encodedClaim{}, err
	}
	key, err := json.Marshal(uid)
	if err != nil {
		return encodedClaim{}, err
	}
	value, err := json.Marshal(w)
	if err != nil {
		return encodedClaim{}, err
	}
	data := make([]byte, 0, len(key)+1+len(value))
	data = append(append(append(data, key...), ':'), value...)
	return encodedClaim{claim: c.Clone(), data: data}, nil
}

// writeJSON appends v's JSON; v is a string or a []string, which always
// encode.
func writeJSON(buf *bytes.Buffer, v any) {
	data, _ := json.Marshal(v)
	buf.Write(data)
}

// sameOnWire reports whether a and b encode to the same bytes. It may say
// no for claims that do (equal instants in two locations of one offset),
// never yes for claims that do not:
// TestSameOnWireSeesEveryField changes every field to prove it.
func sameOnWire(a, b *claimstate.Claim) bool {
	if a.UID != b.UID || a.Namespace != b.Namespace || a.Name != b.Name || a.Phase != b.Phase || a.Adopted != b.Adopted {
		return false
	}
	// Equal instants in one location encode alike.
	if !a.StartedAt.Equal(b.StartedAt) || a.StartedAt.Location() != b.StartedAt.Location() {
		return false
	}
	// Nil and empty consumers, devices and records encode alike.
	if !slices.Equal(a.Consumers, b.Consumers) || !slices.EqualFunc(a.Devices, b.Devices, sameDevice) {
		return false
	}
	return maps.EqualFunc(a.Records, b.Records, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
}

func sameDevice(a, b claimstate.Device) bool {
	return a.Pool == b.Pool && a.Name == b.Name && a.ShareID == b.ShareID && a.AdminAccess == b.AdminAccess &&
		a.UUID == b.UUID && a.ParentUUID == b.ParentUUID &&
		// encoding/json writes null for nil requests and [] for empty ones.
		(a.Requests == nil) == (b.Requests == nil) && slices.Equal(a.Requests, b.Requests) &&
		slices.Equal(a.CDIDeviceIDs, b.CDIDeviceIDs)
}
