package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// The wire types below are the on-disk format, kept apart from claimstate's
// in-memory types so that a change there cannot silently change the file.
// Never rename or retype a field of a released version; within a version,
// add only optional fields that an older reader of the same version may drop
// on rewrite without harm (docs/design/checkpoint.md).

// v5 is v2 plus claims[].records, what each device configurator set up for
// the claim in the configurator's own format, and requires, the names of
// the records the file holds. It is the last version bump a feature needs:
// a reader that does not know a required record leaves the file alone as
// it would a newer version, because it could not undo what the record
// describes. A v2 file is a v5 file without records, and the Store writes
// v2 as long as no claim holds a record, so a rollback to an older plugin
// keeps working on nodes whose claims never needed one. v2 and v5 are the
// only versions read: the development schemas v1, v3 and v4 were never
// released, so no node holds one (docs/design/checkpoint.md).
const (
	versionV2 = "v2"
	versionV5 = "v5"
	// currentVersion is the newest version Store writes (see encode).
	currentVersion = versionV5
	// latestKnown is the number of the newest version this package reads;
	// a file with a higher number is left alone.
	latestKnown = 5
	// readableVersions names, for error messages, the versions decode
	// reads.
	readableVersions = versionV2 + " and " + versionV5
)

// Phases as v2 and later spell them.
const (
	phaseStarted   = "PrepareStarted"
	phaseCompleted = "PrepareCompleted"
)

// fileV5 is the current schema of checkpoint.json (and of v2).
type fileV5 struct {
	Version string `json:"version"`
	// BootID is the boot the state belongs to; state of another boot is void.
	BootID string `json:"bootID"`
	// Requires lists, sorted, the names of the records any claim holds.
	Requires []string            `json:"requires,omitempty"`
	Claims   map[string]*claimV5 `json:"claims"`
}

type claimV5 struct {
	UID       string       `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Phase     string       `json:"phase"`
	StartedAt time.Time    `json:"startedAt"`
	Consumers []consumerV5 `json:"consumers,omitempty"`
	Devices   []deviceV5   `json:"devices"`
	Adopted   bool         `json:"adopted,omitempty"`
	// Records are opaque here: each configurator owns its record's format.
	Records map[string]json.RawMessage `json:"records,omitempty"`
}

// consumerV5 is an entry of the claim's status.reservedFor. apiGroup and
// resource are optional, added within v5 (and v2): absent for a pod, as in
// every file written before, set for any other kind (a PodGroup). An older
// reader drops them on rewrite and takes such a consumer for a pod of that
// name, which it finds gone: it then releases the claim once the claim is
// gone, as it did when it did not record the PodGroup at all.
type consumerV5 struct {
	APIGroup string `json:"apiGroup,omitempty"`
	Resource string `json:"resource,omitempty"`
	Name     string `json:"name"`
	UID      string `json:"uid"`
}

type deviceV5 struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Name         string   `json:"name"`
	ShareID      string   `json:"shareID,omitempty"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	UUID         string   `json:"uuid,omitempty"`
	ParentUUID   string   `json:"parentUUID,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
}

// encode returns the file content for st, which must pass
// [schema.validate]. The output is deterministic (map keys sorted, records
// compacted), so equal states give equal bytes.
func encode(bootID string, st *claimstate.State) ([]byte, error) {
	f, err := toV5(bootID, st)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// requiredRecords returns the sorted names of the records any claim holds.
func requiredRecords(st *claimstate.State) []string {
	names := map[string]bool{}
	for _, c := range st.Claims {
		for name := range c.Records {
			names[name] = true
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// written reports whether a file of version v is in a version the Store
// writes: every gpudra file it reads, unlike an adopted NVIDIA file, which
// is rewritten at Open.
func written(v string) bool { return v == versionV2 || v == versionV5 }

func toV5(bootID string, st *claimstate.State) (*fileV5, error) {
	f := &fileV5{Version: versionV2, BootID: bootID, Claims: make(map[string]*claimV5, len(st.Claims))}
	if f.Requires = requiredRecords(st); len(f.Requires) > 0 {
		f.Version = versionV5
	}
	for uid, c := range st.Claims {
		out, err := claimToV5(uid, c)
		if err != nil {
			return nil, err
		}
		f.Claims[uid] = out
	}
	return f, nil
}

// claimToV5 is the wire form of the claim recorded under uid. It shares
// slices and records with c.
func claimToV5(uid string, c *claimstate.Claim) (*claimV5, error) {
	var phase string
	switch c.Phase {
	case claimstate.PrepareStarted:
		phase = phaseStarted
	case claimstate.PrepareCompleted:
		phase = phaseCompleted
	default:
		return nil, fmt.Errorf("claim %q: unknown phase %q", uid, c.Phase)
	}
	out := &claimV5{
		UID:       c.UID,
		Namespace: c.Namespace,
		Name:      c.Name,
		Phase:     phase,
		StartedAt: c.StartedAt,
		Devices:   make([]deviceV5, len(c.Devices)),
		Adopted:   c.Adopted,
		Records:   c.Records,
	}
	for _, p := range c.Consumers {
		out.Consumers = append(out.Consumers, consumerV5{APIGroup: p.APIGroup, Resource: p.Resource, Name: p.Name, UID: p.UID})
	}
	for i, d := range c.Devices {
		out.Devices[i] = deviceV5{
			Requests:     d.Requests,
			Pool:         d.Pool,
			Name:         d.Name,
			ShareID:      d.ShareID,
			AdminAccess:  d.AdminAccess,
			UUID:         d.UUID,
			ParentUUID:   d.ParentUUID,
			CDIDeviceIDs: d.CDIDeviceIDs,
		}
	}
	return out, nil
}

// schema is what reading and validating a state depends on besides the
// bytes: the records this process knows and this node's pool.
type schema struct {
	known map[string]bool
	pool  string // "" when unknown: pools are kept as read
	// driverName selects the allocation results of NVIDIA's started claims.
	driverName string
}

func newSchema(o options) schema {
	sc := schema{known: map[string]bool{}, pool: o.pool, driverName: o.driverName}
	if sc.driverName == "" {
		sc.driverName = defaultNVIDIADriverName
	}
	for _, name := range o.knownRecords {
		sc.known[name] = true
	}
	return sc
}

// unknownRecords returns, sorted, the record names f requires or its claims
// hold that sc does not know. Both count, so that a file whose requires
// was edited by hand is no easier to misread.
func (sc schema) unknownRecords(f *fileV5) []string {
	unknown := map[string]bool{}
	for _, name := range f.Requires {
		if !sc.known[name] {
			unknown[name] = true
		}
	}
	for _, c := range f.Claims {
		if c == nil {
			continue
		}
		for name := range c.Records {
			if !sc.known[name] {
				unknown[name] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(unknown))
}

// fromV5 converts a decoded v5 (or v2) file into a State, copying
// everything so that the result shares nothing with f, filling in the pool
// of devices recorded without one, and validates it. filled counts those
// devices.
func (sc schema) fromV5(f *fileV5) (st *claimstate.State, filled int, err error) {
	st = claimstate.New()
	for key, c := range f.Claims {
		if c == nil {
			return nil, 0, fmt.Errorf("claim %q: null entry", key)
		}
		var phase claimstate.Phase
		switch c.Phase {
		case phaseStarted:
			phase = claimstate.PrepareStarted
		case phaseCompleted:
			phase = claimstate.PrepareCompleted
		default:
			return nil, 0, fmt.Errorf("claim %q: unknown phase %q (allowed: %s, %s)", key, c.Phase, phaseStarted, phaseCompleted)
		}
		out := &claimstate.Claim{
			UID:       c.UID,
			Namespace: c.Namespace,
			Name:      c.Name,
			Phase:     phase,
			StartedAt: c.StartedAt,
			Devices:   make([]claimstate.Device, len(c.Devices)),
			Adopted:   c.Adopted,
			Records:   claimstate.CloneRecords(c.Records),
		}
		for _, p := range c.Consumers {
			out.Consumers = append(out.Consumers, claimstate.NewConsumer(p.APIGroup, p.Resource, p.Name, p.UID))
		}
		for i, d := range c.Devices {
			out.Devices[i] = claimstate.Device{
				Requests:     append([]string(nil), d.Requests...),
				Pool:         d.Pool,
				Name:         d.Name,
				ShareID:      d.ShareID,
				AdminAccess:  d.AdminAccess,
				UUID:         d.UUID,
				ParentUUID:   d.ParentUUID,
				CDIDeviceIDs: append([]string(nil), d.CDIDeviceIDs...),
			}
			if d.Pool == "" && sc.pool != "" {
				out.Devices[i].Pool = sc.pool
				filled++
			}
		}
		st.Claims[key] = out
	}
	if err := sc.validate(st); err != nil {
		return nil, 0, err
	}
	if err := canonicalizeRecords(st); err != nil {
		return nil, 0, err
	}
	return st, filled, nil
}

// validate checks what the file format needs of a State: whatever passes is
// written and read back unchanged (once [canonicalizeRecords] has run).
// Store runs it after every mutation, so a mutation can never produce a
// file that the next Open would move aside or refuse.
func (sc schema) validate(st *claimstate.State) error {
	for key, c := range st.Claims {
		if key == "" {
			return errors.New("claim with an empty UID key")
		}
		if c == nil {
			return fmt.Errorf("claim %q: nil entry", key)
		}
		if c.UID != key {
			return fmt.Errorf("claim %q: uid %q differs from its key", key, c.UID)
		}
		if c.Phase != claimstate.PrepareStarted && c.Phase != claimstate.PrepareCompleted {
			return fmt.Errorf("claim %q: unknown phase %q (allowed: %s, %s)", key, c.Phase, claimstate.PrepareStarted, claimstate.PrepareCompleted)
		}
		// encoding/json refuses to write times outside these years.
		if y := c.StartedAt.Year(); y < 0 || y > 9999 {
			return fmt.Errorf("claim %q: startedAt %v outside years 0-9999", key, c.StartedAt)
		}
		if sc.pool != "" {
			for _, d := range c.Devices {
				if d.Pool == "" {
					return fmt.Errorf("claim %q: device %q has no pool (this node's is %q)", key, d.Name, sc.pool)
				}
			}
		}
		for _, name := range c.RecordNames() {
			if name == "" {
				return fmt.Errorf("claim %q: record with an empty name", key)
			}
			if !sc.known[name] {
				return fmt.Errorf("claim %q: record %q: not a known record (known: %s)", key, name, sc.knownList())
			}
			rec := c.Records[name]
			if len(rec) == 0 {
				return fmt.Errorf("claim %q: record %q is empty, not JSON", key, name)
			}
			if !json.Valid(rec) {
				return fmt.Errorf("claim %q: record %q is not valid JSON", key, name)
			}
		}
	}
	return nil
}

func (sc schema) knownList() string {
	if len(sc.known) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(sc.known)), ", ")
}

// canonicalizeRecords rewrites every record of st, which must be valid
// JSON, in the form encode writes it (compact, HTML characters escaped), so
// that the state in memory equals the state read back from the file.
func canonicalizeRecords(st *claimstate.State) error {
	for key, c := range st.Claims {
		for name, rec := range c.Records {
			out, err := json.Marshal(rec)
			if err != nil {
				return fmt.Errorf("claim %q: record %q: %w", key, name, err)
			}
			c.Records[name] = out
		}
	}
	return nil
}
