package checkpoint

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

// v3 and v4 kept what gpudra set up for a device in per-feature device
// fields: v3 added devices[].dynamicMIG, v4 devices[].sharing and
// devices[].vfio. v5 keeps the same facts as claim records, one per
// configurator, in the formats below (docs/design/checkpoint.md). These formats
// are fixed as of the migration; from v5 on each configurator owns its
// record's format, and the packages that decode them must keep reading
// what the migration writes.

// Names of the records the migration from v3 and v4 writes.
const (
	recordDynamicMIG  = "dynamicMIG"
	recordVFIO        = "vfio"
	recordTimeSlicing = "timeSlicing"
	recordMPS         = "mps"
)

// fileV4 is the schema of v3 and v4 files (and of v2, which has none of the
// per-feature fields).
type fileV4 struct {
	Version string              `json:"version"`
	BootID  string              `json:"bootID"`
	Claims  map[string]*claimV4 `json:"claims"`
}

type claimV4 struct {
	UID       string       `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Phase     string       `json:"phase"`
	StartedAt time.Time    `json:"startedAt"`
	Consumers []consumerV5 `json:"consumers,omitempty"`
	Devices   []deviceV4   `json:"devices"`
	Adopted   bool         `json:"adopted,omitempty"`
}

type deviceV4 struct {
	deviceV5
	// DynamicMIG is new in v3.
	DynamicMIG *dynamicMIGV3 `json:"dynamicMIG,omitempty"`
	// Sharing and VFIO are new in v4.
	Sharing *sharingV4 `json:"sharing,omitempty"`
	VFIO    *vfioV4    `json:"vfio,omitempty"`
}

type dynamicMIGV3 struct {
	Profile   string `json:"profile"`
	ProfileID int    `json:"profileID"`
	Start     int    `json:"start"`
	Size      int    `json:"size"`
	GIID      int    `json:"giID,omitempty"`
	CIID      int    `json:"ciID,omitempty"`
}

type sharingV4 struct {
	TimeSlice string `json:"timeSlice,omitempty"`
	MPSDaemon string `json:"mpsDaemon,omitempty"`
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

// The record formats as of the migration.

// dynamicMIGRecord is record "dynamicMIG": the MIG instances gpudra
// creates for the claim, one per device name.
type dynamicMIGRecord struct {
	Devices []dynamicMIGDevice `json:"devices"`
}

type dynamicMIGDevice struct {
	Device     string `json:"device"`
	ParentUUID string `json:"parentUUID"`
	Profile    string `json:"profile"`
	ProfileID  int    `json:"profileID"`
	Start      int    `json:"start"`
	Size       int    `json:"size"`
	UUID       string `json:"uuid,omitempty"`
	GIID       int    `json:"giID,omitempty"`
	CIID       int    `json:"ciID,omitempty"`
}

// vfioRecord is record "vfio": the IOMMU groups bound to VFIO.
type vfioRecord struct {
	Devices []vfioDevice `json:"devices"`
}

type vfioDevice struct {
	Device     string           `json:"device"`
	GPU        string           `json:"gpu"`
	IOMMUGroup int              `json:"iommuGroup"`
	Functions  []vfioFunctionV4 `json:"functions"`
}

// timeSlicingRecord is record "timeSlicing": the interval the claim holds
// on each time-sliced GPU.
type timeSlicingRecord struct {
	GPUs []timeSlicedGPU `json:"gpus"`
}

type timeSlicedGPU struct {
	Device   string `json:"device"`
	GPU      string `json:"gpu"`
	Interval string `json:"interval"`
}

// mpsRecord is record "mps": the MPS control daemons serving the claim's
// devices.
type mpsRecord struct {
	Daemons []mpsDaemon `json:"daemons"`
}

type mpsDaemon struct {
	ID      string   `json:"id"`
	Devices []string `json:"devices"`
}

// migrateV4 converts a v2, v3 or v4 file into v5: the per-feature device
// fields become claim records, entries in device order. The result is
// labelled v5 only if some claim holds a record.
func migrateV4(f *fileV4) (*fileV5, error) {
	out := &fileV5{Version: versionV2, BootID: f.BootID, Claims: make(map[string]*claimV5, len(f.Claims))}
	required := map[string]bool{}
	for key, c := range f.Claims {
		if c == nil {
			return nil, fmt.Errorf("claim %q: null entry", key)
		}
		nc := &claimV5{
			UID:       c.UID,
			Namespace: c.Namespace,
			Name:      c.Name,
			Phase:     c.Phase,
			StartedAt: c.StartedAt,
			Consumers: c.Consumers,
			Devices:   make([]deviceV5, len(c.Devices)),
			Adopted:   c.Adopted,
		}
		var (
			mig      dynamicMIGRecord
			migSeen  = map[string]bool{}
			vfio     vfioRecord
			ts       timeSlicingRecord
			mps      mpsRecord
			mpsIndex = map[string]int{}
		)
		for i, d := range c.Devices {
			nc.Devices[i] = d.deviceV5
			if m := d.DynamicMIG; m != nil && !migSeen[d.Name] {
				migSeen[d.Name] = true
				mig.Devices = append(mig.Devices, dynamicMIGDevice{
					Device: d.Name, ParentUUID: d.ParentUUID,
					Profile: m.Profile, ProfileID: m.ProfileID, Start: m.Start, Size: m.Size,
					UUID: d.UUID, GIID: m.GIID, CIID: m.CIID,
				})
			}
			if v := d.VFIO; v != nil {
				vfio.Devices = append(vfio.Devices, vfioDevice{
					Device: d.Name, GPU: v.GPU, IOMMUGroup: v.IOMMUGroup,
					Functions: v.Functions,
				})
			}
			if sh := d.Sharing; sh != nil && sh.TimeSlice != "" {
				ts.GPUs = append(ts.GPUs, timeSlicedGPU{Device: d.Name, GPU: d.UUID, Interval: sh.TimeSlice})
			}
			if sh := d.Sharing; sh != nil && sh.MPSDaemon != "" {
				j, ok := mpsIndex[sh.MPSDaemon]
				if !ok {
					j = len(mps.Daemons)
					mpsIndex[sh.MPSDaemon] = j
					mps.Daemons = append(mps.Daemons, mpsDaemon{ID: sh.MPSDaemon})
				}
				if names := &mps.Daemons[j].Devices; !slices.Contains(*names, d.Name) {
					*names = append(*names, d.Name)
				}
			}
		}
		records := map[string]any{}
		if len(mig.Devices) > 0 {
			records[recordDynamicMIG] = mig
		}
		if len(vfio.Devices) > 0 {
			records[recordVFIO] = vfio
		}
		if len(ts.GPUs) > 0 {
			records[recordTimeSlicing] = ts
		}
		if len(mps.Daemons) > 0 {
			records[recordMPS] = mps
		}
		for name, rec := range records {
			raw, err := json.Marshal(rec)
			if err != nil {
				return nil, fmt.Errorf("claim %q: record %q: %w", key, name, err)
			}
			if nc.Records == nil {
				nc.Records = map[string]json.RawMessage{}
			}
			nc.Records[name] = raw
			required[name] = true
		}
		out.Claims[key] = nc
	}
	if out.Requires = slices.Sorted(maps.Keys(required)); len(out.Requires) > 0 {
		out.Version = versionV5
	}
	return out, nil
}
