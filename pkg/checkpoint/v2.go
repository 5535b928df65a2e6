package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// The wire types below are the on-disk format, kept apart from claimstate's
// in-memory types so that a change there cannot silently change the file.
// Never rename or retype a field of a released version; within a version,
// add only optional fields that an older reader of the same version may drop
// on rewrite without harm (docs/checkpoint.md).

const (
	versionV1 = "v1"
	versionV2 = "v2"
	// currentVersion is the version Store writes.
	currentVersion = versionV2
	// latestKnown is the number of the newest version this package reads;
	// a file with a higher number is left alone.
	latestKnown = 2
)

// Phases as v2 spells them.
const (
	phaseV2Started   = "PrepareStarted"
	phaseV2Completed = "PrepareCompleted"
)

// fileV2 is the current schema of checkpoint.json.
type fileV2 struct {
	Version string `json:"version"`
	// BootID is the boot the state belongs to; state of another boot is void.
	BootID string              `json:"bootID"`
	Claims map[string]*claimV2 `json:"claims"`
}

type claimV2 struct {
	UID       string       `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Phase     string       `json:"phase"`
	StartedAt time.Time    `json:"startedAt"`
	Consumers []consumerV2 `json:"consumers,omitempty"`
	Devices   []deviceV2   `json:"devices"`
	Adopted   bool         `json:"adopted,omitempty"`
}

type consumerV2 struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

type deviceV2 struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Name         string   `json:"name"`
	ShareID      string   `json:"shareID,omitempty"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	UUID         string   `json:"uuid,omitempty"`
	ParentUUID   string   `json:"parentUUID,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
}

// encodeV2 returns the file content for st, which must pass [validate].
// The output is deterministic (map keys sorted), so equal states give equal
// bytes.
func encodeV2(bootID string, st *claimstate.State) ([]byte, error) {
	f, err := toV2(bootID, st)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

func toV2(bootID string, st *claimstate.State) (*fileV2, error) {
	f := &fileV2{Version: versionV2, BootID: bootID, Claims: make(map[string]*claimV2, len(st.Claims))}
	for uid, c := range st.Claims {
		var phase string
		switch c.Phase {
		case claimstate.PrepareStarted:
			phase = phaseV2Started
		case claimstate.PrepareCompleted:
			phase = phaseV2Completed
		default:
			return nil, fmt.Errorf("claim %q: unknown phase %q", uid, c.Phase)
		}
		out := &claimV2{
			UID:       c.UID,
			Namespace: c.Namespace,
			Name:      c.Name,
			Phase:     phase,
			StartedAt: c.StartedAt,
			Devices:   make([]deviceV2, len(c.Devices)),
			Adopted:   c.Adopted,
		}
		for _, p := range c.Consumers {
			out.Consumers = append(out.Consumers, consumerV2{Name: p.Name, UID: p.UID})
		}
		for i, d := range c.Devices {
			out.Devices[i] = deviceV2{
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
		f.Claims[uid] = out
	}
	return f, nil
}

// fromV2 converts a decoded v2 file into a State, copying every slice so
// that the result shares nothing with f, and validates it.
func fromV2(f *fileV2) (*claimstate.State, error) {
	st := claimstate.New()
	for key, c := range f.Claims {
		if c == nil {
			return nil, fmt.Errorf("claim %q: null entry", key)
		}
		var phase claimstate.Phase
		switch c.Phase {
		case phaseV2Started:
			phase = claimstate.PrepareStarted
		case phaseV2Completed:
			phase = claimstate.PrepareCompleted
		default:
			return nil, fmt.Errorf("claim %q: unknown phase %q (allowed: %s, %s)", key, c.Phase, phaseV2Started, phaseV2Completed)
		}
		out := &claimstate.Claim{
			UID:       c.UID,
			Namespace: c.Namespace,
			Name:      c.Name,
			Phase:     phase,
			StartedAt: c.StartedAt,
			Devices:   make([]claimstate.Device, len(c.Devices)),
			Adopted:   c.Adopted,
		}
		for _, p := range c.Consumers {
			out.Consumers = append(out.Consumers, claimstate.Consumer{Name: p.Name, UID: p.UID})
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
		}
		st.Claims[key] = out
	}
	if err := validate(st); err != nil {
		return nil, err
	}
	return st, nil
}

// validate checks what the file format needs of a State: whatever passes is
// written and read back unchanged. Store runs it after every mutation, so a
// mutation can never produce a file that the next Open would move aside.
func validate(st *claimstate.State) error {
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
	}
	return nil
}
