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

// v3 is v2 plus devices[].dynamicMIG, the MIG instances gpudra creates. It
// is a new version, not an optional v2 field, because a v2 reader would drop
// the field on rewrite and so lose the ownership of those instances; an
// older plugin leaves a v3 file alone instead. A v2 file is a v3 file
// without that field, so one set of wire types reads both, and the Store
// writes v2 as long as no claim holds a dynamic MIG device: a rollback to a
// v2 plugin keeps working on nodes that never used dynamic MIG.
//
// v4 is v3 plus devices[].sharing, the time-slice intervals and MPS daemons
// gpudra set up for shared devices, and devices[].vfio, the IOMMU groups it
// bound to VFIO, for the same reason: a v3 reader would drop them on
// rewrite and then never reset the GPU's interval, stop the daemon or give
// the GPU back to its driver. The Store writes v4 only while a claim holds
// a shared or passed-through device.
const (
	versionV1 = "v1"
	versionV2 = "v2"
	versionV3 = "v3"
	versionV4 = "v4"
	// currentVersion is the newest version Store writes (see versionFor).
	currentVersion = versionV4
	// latestKnown is the number of the newest version this package reads;
	// a file with a higher number is left alone.
	latestKnown = 4
)

// Phases as v2 and v3 spell them.
const (
	phaseStarted   = "PrepareStarted"
	phaseCompleted = "PrepareCompleted"
)

// fileV3 is the current schema of checkpoint.json (and of v2).
type fileV3 struct {
	Version string `json:"version"`
	// BootID is the boot the state belongs to; state of another boot is void.
	BootID string              `json:"bootID"`
	Claims map[string]*claimV3 `json:"claims"`
}

type claimV3 struct {
	UID       string       `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Phase     string       `json:"phase"`
	StartedAt time.Time    `json:"startedAt"`
	Consumers []consumerV3 `json:"consumers,omitempty"`
	Devices   []deviceV3   `json:"devices"`
	Adopted   bool         `json:"adopted,omitempty"`
}

type consumerV3 struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

type deviceV3 struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Name         string   `json:"name"`
	ShareID      string   `json:"shareID,omitempty"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	UUID         string   `json:"uuid,omitempty"`
	ParentUUID   string   `json:"parentUUID,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// DynamicMIG is new in v3.
	DynamicMIG *dynamicMIGV3 `json:"dynamicMIG,omitempty"`
	// Sharing and VFIO are new in v4.
	Sharing *sharingV4 `json:"sharing,omitempty"`
	VFIO    *vfioV4    `json:"vfio,omitempty"`
}

type vfioV4 struct {
	GPU        string           `json:"gpu"`
	IOMMUGroup int              `json:"iommuGroup"`
	Functions  []vfioFunctionV4 `json:"functions"`
}

type vfioFunctionV4 struct {
	BusID                  string `json:"busID"`
	Driver                 string `json:"driver"`
	OriginalDriver         string `json:"originalDriver,omitempty"`
	OriginalDriverOverride string `json:"originalDriverOverride,omitempty"`
}

type sharingV4 struct {
	TimeSlice string `json:"timeSlice,omitempty"`
	MPSDaemon string `json:"mpsDaemon,omitempty"`
}

type dynamicMIGV3 struct {
	Profile   string `json:"profile"`
	ProfileID int    `json:"profileID"`
	Start     int    `json:"start"`
	Size      int    `json:"size"`
	GIID      int    `json:"giID,omitempty"`
	CIID      int    `json:"ciID,omitempty"`
}

// encode returns the file content for st, which must pass [validate].
// The output is deterministic (map keys sorted), so equal states give equal
// bytes.
func encode(bootID string, st *claimstate.State) ([]byte, error) {
	f, err := toV3(bootID, st)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// versionFor is the version a state is written in: the oldest that holds it.
func versionFor(st *claimstate.State) string {
	v := versionV2
	for _, c := range st.Claims {
		for _, d := range c.Devices {
			if d.Sharing != nil || d.VFIO != nil {
				return versionV4
			}
			if d.DynamicMIG != nil {
				v = versionV3
			}
		}
	}
	return v
}

// written reports whether a file of version v is in a version the Store
// writes, so that reading it needs no migration.
func written(v string) bool { return v == versionV2 || v == versionV3 || v == versionV4 }

func toV3(bootID string, st *claimstate.State) (*fileV3, error) {
	f := &fileV3{Version: versionFor(st), BootID: bootID, Claims: make(map[string]*claimV3, len(st.Claims))}
	for uid, c := range st.Claims {
		var phase string
		switch c.Phase {
		case claimstate.PrepareStarted:
			phase = phaseStarted
		case claimstate.PrepareCompleted:
			phase = phaseCompleted
		default:
			return nil, fmt.Errorf("claim %q: unknown phase %q", uid, c.Phase)
		}
		out := &claimV3{
			UID:       c.UID,
			Namespace: c.Namespace,
			Name:      c.Name,
			Phase:     phase,
			StartedAt: c.StartedAt,
			Devices:   make([]deviceV3, len(c.Devices)),
			Adopted:   c.Adopted,
		}
		for _, p := range c.Consumers {
			out.Consumers = append(out.Consumers, consumerV3{Name: p.Name, UID: p.UID})
		}
		for i, d := range c.Devices {
			out.Devices[i] = deviceV3{
				Requests:     d.Requests,
				Pool:         d.Pool,
				Name:         d.Name,
				ShareID:      d.ShareID,
				AdminAccess:  d.AdminAccess,
				UUID:         d.UUID,
				ParentUUID:   d.ParentUUID,
				CDIDeviceIDs: d.CDIDeviceIDs,
			}
			if m := d.DynamicMIG; m != nil {
				out.Devices[i].DynamicMIG = &dynamicMIGV3{Profile: m.Profile, ProfileID: m.ProfileID, Start: m.Start, Size: m.Size, GIID: m.GIID, CIID: m.CIID}
			}
			if sh := d.Sharing; sh != nil {
				out.Devices[i].Sharing = &sharingV4{TimeSlice: sh.TimeSlice, MPSDaemon: sh.MPSDaemon}
			}
			if v := d.VFIO; v != nil {
				w := &vfioV4{GPU: v.GPU, IOMMUGroup: v.IOMMUGroup}
				for _, f := range v.Functions {
					w.Functions = append(w.Functions, vfioFunctionV4(f))
				}
				out.Devices[i].VFIO = w
			}
		}
		f.Claims[uid] = out
	}
	return f, nil
}

// fromV3 converts a decoded v3 (or v2) file into a State, copying every slice so
// that the result shares nothing with f, and validates it.
func fromV3(f *fileV3) (*claimstate.State, error) {
	st := claimstate.New()
	for key, c := range f.Claims {
		if c == nil {
			return nil, fmt.Errorf("claim %q: null entry", key)
		}
		var phase claimstate.Phase
		switch c.Phase {
		case phaseStarted:
			phase = claimstate.PrepareStarted
		case phaseCompleted:
			phase = claimstate.PrepareCompleted
		default:
			return nil, fmt.Errorf("claim %q: unknown phase %q (allowed: %s, %s)", key, c.Phase, phaseStarted, phaseCompleted)
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
			if m := d.DynamicMIG; m != nil {
				out.Devices[i].DynamicMIG = &claimstate.DynamicMIG{Profile: m.Profile, ProfileID: m.ProfileID, Start: m.Start, Size: m.Size, GIID: m.GIID, CIID: m.CIID}
			}
			if sh := d.Sharing; sh != nil {
				out.Devices[i].Sharing = &claimstate.Sharing{TimeSlice: sh.TimeSlice, MPSDaemon: sh.MPSDaemon}
			}
			if w := d.VFIO; w != nil {
				v := &claimstate.VFIO{GPU: w.GPU, IOMMUGroup: w.IOMMUGroup}
				for _, f := range w.Functions {
					v.Functions = append(v.Functions, claimstate.VFIOFunction(f))
				}
				out.Devices[i].VFIO = v
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
