package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// RecordsAnnotation is the spec annotation that carries what the device
// configurators set up for the claim (the checkpoint's records), so that a
// claim adopted from its spec after the checkpoint was lost knows its MIG
// instances, passthrough, time slices and daemons, and Unprepare undoes
// them. CDI spec annotations never reach the container.
const RecordsAnnotation = "gpudra.io/records"

// DevicesAnnotation is the spec annotation that carries the hardware
// identity of the claim's devices (UUIDs), so that a claim adopted from its
// spec still conflicts with a claim for the same GPU under another name
// (gpu-N beside gpu-vfio-N, a GPU beside a MIG device on it), also when
// discovery no longer lists the GPU (passed through to VFIO).
const DevicesAnnotation = "gpudra.io/devices"

// DeviceIdentity is the hardware identity of one device of a claim.
type DeviceIdentity struct {
	Name       string `json:"name"`
	ShareID    string `json:"shareID,omitempty"`
	UUID       string `json:"uuid,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
}

// SetClaim stores what adoption needs of a claim in its spec: the
// identity of its devices and its records (nil records: none).
func SetClaim(spec *cdispec.Spec, devices []DeviceIdentity, records map[string]json.RawMessage) error {
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	data, err := json.Marshal(devices)
	if err != nil {
		return fmt.Errorf("devices annotation: %w", err)
	}
	spec.Annotations[DevicesAnnotation] = string(data)
	if len(records) > 0 {
		data, err := json.Marshal(records)
		if err != nil {
			return fmt.Errorf("records annotation: %w", err)
		}
		spec.Annotations[RecordsAnnotation] = string(data)
	}
	return setVersion(spec)
}

// SpecContent is what a claim's spec file says about the claim.
type SpecContent struct {
	// DeviceNames are the names of the spec's devices as the device model
	// names them (the CDI device names without the "<uid>-" prefix).
	DeviceNames []string
	// Records are the records the spec carries, nil if none.
	Records map[string]json.RawMessage
	// Devices are the identities of the devices, nil for a spec of an
	// older plugin.
	Devices []DeviceIdentity
}

// Read parses a claim's spec file: this driver's, or, when there is none,
// the YAML one NVIDIA's DRA driver wrote ([Writer.NVIDIAPath]). NVIDIA's
// names its devices as this driver does (<claim uid>-<device>) and
// carries neither records nor device identities.
func (w *Writer) Read(claimUID string) (SpecContent, error) {
	data, err := os.ReadFile(w.Path(claimUID))
	if errors.Is(err, fs.ErrNotExist) {
		data, err = os.ReadFile(w.NVIDIAPath(claimUID))
	}
	if err != nil {
		return SpecContent{}, fmt.Errorf("read CDI spec for claim %s: %w", claimUID, err)
	}
	spec, err := cdiapi.ParseSpec(data)
	if err == nil && spec == nil {
		// A YAML null ("null", "~", a document marker alone) parses
		// without error to no spec.
		err = errors.New("the file holds no spec (YAML null)")
	}
	if err != nil {
		return SpecContent{}, fmt.Errorf("parse CDI spec for claim %s: %w", claimUID, err)
	}
	var out SpecContent
	prefix := DeviceName(claimUID, "")
	for _, d := range spec.Devices {
		if name, ok := strings.CutPrefix(d.Name, prefix); ok && name != "" {
			out.DeviceNames = append(out.DeviceNames, name)
		}
	}
	if raw, ok := spec.Annotations[RecordsAnnotation]; ok {
		if err := json.Unmarshal([]byte(raw), &out.Records); err != nil {
			return out, fmt.Errorf("CDI spec for claim %s: annotation %s: %w", claimUID, RecordsAnnotation, err)
		}
	}
	if raw, ok := spec.Annotations[DevicesAnnotation]; ok {
		if err := json.Unmarshal([]byte(raw), &out.Devices); err != nil {
			return out, fmt.Errorf("CDI spec for claim %s: annotation %s: %w", claimUID, DevicesAnnotation, err)
		}
	}
	return out, nil
}

// allocIDSuffix matches a CDI device name of one allocation of a shareable
// device: the device name and the share ID the allocator made, a UUID (see
// [ShareName]).
var allocIDSuffix = regexp.MustCompile(`^(.+)-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)

// SplitDeviceName splits the name of a claim's CDI device (without the
// claim UID) into the device name and the share ID, "" for a device
// allocated whole: the inverse of [ShareName].
func SplitDeviceName(name string) (device, shareID string) {
	if m := allocIDSuffix.FindStringSubmatch(name); m != nil {
		return m[1], m[2]
	}
	return name, ""
}
