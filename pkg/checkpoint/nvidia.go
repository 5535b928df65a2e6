package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) keeps its
// prepared claims in the same file, checkpoint.json in the plugin data
// directory of driver gpu.nvidia.com, in a format of its own:
// docs/design/checkpoint.md ("NVIDIA's checkpoint") describes it. Reading it lets
// gpudra replace that driver on a node without draining it: the claims it
// prepared are converted into gpudra records (adopted) at Open.
//
// The wire types below read only what the conversion needs; unknown fields
// are ignored. The checksums are verified over the bytes as they stand in
// the file, never over a re-marshalled struct, so a field NVIDIA adds does
// not make a file unreadable.

// Source versions reported in OpenReport.Migrated for NVIDIA files.
const (
	// NVIDIAv1 is a file with only NVIDIA's "v1" section (its releases
	// before prepare states were recorded).
	NVIDIAv1 = "nvidia-v1"
	// NVIDIAv2 is a file with NVIDIA's "v2" section (with or without its
	// top-level "version": "v2"), read in preference to "v1".
	NVIDIAv2 = "nvidia-v2"
)

// ErrNVIDIACheckpoint is matched (with errors.Is) by the error that makes
// a checkpoint of NVIDIA's DRA driver unreadable: one whose checksums do
// not hold, or that is not whole JSON. Its message starts "NVIDIA DRA
// driver checkpoint: ". The Store moves such a file aside like an
// unreadable file of its own ([OpenReport.Corrupt]).
var ErrNVIDIACheckpoint = errors.New("NVIDIA DRA driver checkpoint is unreadable")

// nvidiaError is an error found in a checkpoint of NVIDIA's DRA driver.
type nvidiaError struct{ err error }

func (e *nvidiaError) Error() string { return "NVIDIA DRA driver checkpoint: " + e.err.Error() }
func (e *nvidiaError) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrNVIDIACheckpoint) hold.
func (e *nvidiaError) Is(target error) bool { return target == ErrNVIDIACheckpoint }

// nvidiaHead matches the start of a file NVIDIA's DRA driver wrote
// (json.Marshal of its Checkpoint: an optional "version", then "checksum"
// first), which no gpudra version writes: it tells a truncated or damaged
// NVIDIA file, which no longer parses, from one of gpudra's.
var nvidiaHead = regexp.MustCompile(`^\s*\{("version":"[^"\\]*",)?"checksum":`)

// nvidiaAsideInfix names the copy of an adopted NVIDIA file:
// checkpoint.json.nvidia-<UTC time>.
const nvidiaAsideInfix = ".nvidia-"

// defaultNVIDIADriverName is the driver name whose allocation results a
// started NVIDIA claim holds ([WithDriverName]).
const defaultNVIDIADriverName = v1beta1.GPUDriverName

type nvFile struct {
	Version  string          `json:"version"`
	Checksum *uint64         `json:"checksum"`
	V1       json.RawMessage `json:"v1"`
	V2       json.RawMessage `json:"v2"`
}

type nvSectionV2 struct {
	Checksum       uint64                   `json:"checksum"`
	PreparedClaims map[string]*nvPreparedV2 `json:"preparedClaims"`
	NodeBootID     string                   `json:"nodeBootID"`
}

type nvSectionV1 struct {
	PreparedClaims map[string]*nvPreparedV1 `json:"preparedClaims"`
}

type nvPreparedV1 struct {
	Status          nvClaimStatus `json:"status"`
	PreparedDevices []*nvGroup    `json:"preparedDevices"`
}

type nvPreparedV2 struct {
	CheckpointState string        `json:"checkpointState"`
	Status          nvClaimStatus `json:"status"`
	PreparedDevices []*nvGroup    `json:"preparedDevices"`
	Name            string        `json:"name"`
	Namespace       string        `json:"namespace"`
}

// nvClaimStatus is the part of a resource.k8s.io/v1 ResourceClaimStatus
// the conversion reads.
type nvClaimStatus struct {
	Allocation *struct {
		Devices struct {
			Results []nvResult `json:"results"`
		} `json:"devices"`
	} `json:"allocation"`
	ReservedFor []struct {
		APIGroup string `json:"apiGroup"`
		Resource string `json:"resource"`
		Name     string `json:"name"`
		UID      string `json:"uid"`
	} `json:"reservedFor"`
}

type nvResult struct {
	Request     string  `json:"request"`
	Driver      string  `json:"driver"`
	Pool        string  `json:"pool"`
	Device      string  `json:"device"`
	AdminAccess *bool   `json:"adminAccess"`
	ShareID     *string `json:"shareID"`
}

type nvGroup struct {
	Devices []nvDevice `json:"devices"`
}

// nvDevice is one prepared device: exactly one kind is set.
type nvDevice struct {
	GPU *struct {
		Info   *struct{ UUID string } `json:"info"`
		Device *nvKubeletDevice       `json:"device"`
	} `json:"gpu"`
	MIG *struct {
		Concrete *struct {
			MigUUID    string `json:"migUUID"`
			ParentUUID string `json:"parentUUID"`
		} `json:"concrete"`
		Device *nvKubeletDevice `json:"device"`
	} `json:"mig"`
	VFIO *struct {
		Info   *struct{ UUID string } `json:"info"`
		Device *nvKubeletDevice       `json:"device"`
	} `json:"vfio"`
}

// nvKubeletDevice is kubeletplugin.Device as NVIDIA serializes it (Go field
// names, no tags).
type nvKubeletDevice struct {
	Requests     []string `json:"Requests"`
	PoolName     string   `json:"PoolName"`
	DeviceName   string   `json:"DeviceName"`
	CDIDeviceIDs []string `json:"CDIDeviceIDs"`
	ShareID      *string  `json:"ShareID"`
}

// nvidiaDecoded is what the conversion found besides the claims.
type nvidiaDecoded struct {
	// started counts claims adopted in PrepareStarted.
	started int
	// skipped counts started claims that held no device of the driver
	// (NVIDIA records the start before it checks the allocation).
	skipped int
}

// looksLikeNVIDIA reports whether data is a JSON object in NVIDIA's layout:
// a top-level "checksum" and a "v1" or "v2" section, and none of the fields
// every gpudra version has. NVIDIA's current release writes "version": "v2"
// too, which alone would read as an empty gpudra v2 file.
func looksLikeNVIDIA(data []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) != nil {
		return false
	}
	_, checksum := top["checksum"]
	_, v1 := top["v1"]
	_, v2 := top["v2"]
	_, claims := top["claims"]
	_, prepared := top["preparedClaims"]
	return checksum && (v1 || v2) && !claims && !prepared
}

// truncatedNVIDIA returns the error of data that starts as a file of
// NVIDIA's DRA driver but is not whole JSON (cut short, or damaged), nil
// for anything else.
func truncatedNVIDIA(data []byte) error {
	if !nvidiaHead.Match(data) {
		return nil
	}
	var v any
	err := json.Unmarshal(data, &v)
	if err == nil {
		return nil
	}
	return &nvidiaError{fmt.Errorf("not whole JSON (cut short or damaged), so its checksums cannot be verified: %w", err)}
}

// decodeNVIDIA reads a file in NVIDIA's layout into the v5 shape. Its
// checksums must hold as NVIDIA's checkpoint manager verifies them; a file
// whose checksums do not hold is unreadable, as it is to NVIDIA's driver.
// Its errors match [ErrNVIDIACheckpoint], except that of a later NVIDIA
// format, which is a *newerVersionError.
func (sc schema) decodeNVIDIA(data []byte) (decoded, error) {
	d, err := sc.decodeNVIDIAFile(data)
	var newer *newerVersionError
	if err != nil && !errors.As(err, &newer) {
		return decoded{}, &nvidiaError{err}
	}
	return d, err
}

func (sc schema) decodeNVIDIAFile(data []byte) (decoded, error) {
	var f nvFile
	if err := json.Unmarshal(data, &f); err != nil {
		return decoded{}, err
	}
	switch f.Version {
	case "", "v2":
	default:
		// A later NVIDIA format: leave it alone, as for a newer gpudra
		// version, since NVIDIA's driver may be rolled back to.
		return decoded{}, &newerVersionError{version: "NVIDIA " + f.Version}
	}
	if f.Checksum == nil {
		return decoded{}, errors.New("checksum is not a number")
	}
	if err := verifyNVIDIAChecksums(data, &f); err != nil {
		return decoded{}, err
	}
	var (
		out  *fileV5
		info nvidiaDecoded
		from string
		err  error
	)
	if isSection(f.V2) {
		var v2 nvSectionV2
		if err := json.Unmarshal(f.V2, &v2); err != nil {
			return decoded{}, fmt.Errorf("v2: %w", err)
		}
		out, info, err = sc.fromNVIDIAv2(&v2)
		from = NVIDIAv2
	} else {
		var v1 nvSectionV1
		if err := json.Unmarshal(f.V1, &v1); err != nil {
			return decoded{}, fmt.Errorf("v1: %w", err)
		}
		v2 := nvSectionV2{PreparedClaims: map[string]*nvPreparedV2{}}
		for uid, c := range v1.PreparedClaims {
			if c == nil {
				return decoded{}, fmt.Errorf("v1: claim %q: null entry", uid)
			}
			// NVIDIA's v1 recorded completed preparations only.
			v2.PreparedClaims[uid] = &nvPreparedV2{CheckpointState: phaseCompleted, Status: c.Status, PreparedDevices: c.PreparedDevices}
		}
		out, info, err = sc.fromNVIDIAv2(&v2)
		from = NVIDIAv1
	}
	if err != nil {
		return decoded{}, err
	}
	d, err := sc.fromFile(out, from)
	if err != nil {
		return decoded{}, err
	}
	d.nvidia = &info
	return d, nil
}

// stampAdoption makes now, the adoption, the start of every claim adopted
// from NVIDIA's file, which records no start time. With none, a started
// claim would look abandoned since year 1, and the first sweep would roll
// it back before the kubelet's retry that the call timeout leaves it for.
func stampAdoption(st *claimstate.State, now time.Time) {
	for _, c := range st.Claims {
		c.StartedAt = now
	}
}

func isSection(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// fromNVIDIAv2 converts NVIDIA's claims. A completed claim keeps the devices
// NVIDIA handed to the kubelet, with their CDI device IDs unchanged (the
// kubelet caches them, and NVIDIA's CDI spec defines them). A started claim
// holds the devices of its allocation and no CDI IDs: gpudra rolls it back
// (removes its spec) before preparing it again, or when the sweep finds it
// abandoned, as for one of its own.
func (sc schema) fromNVIDIAv2(v2 *nvSectionV2) (*fileV5, nvidiaDecoded, error) {
	var info nvidiaDecoded
	out := &fileV5{Version: versionV2, BootID: v2.NodeBootID, Claims: make(map[string]*claimV5, len(v2.PreparedClaims))}
	for _, uid := range slices.Sorted(maps.Keys(v2.PreparedClaims)) {
		c := v2.PreparedClaims[uid]
		if c == nil {
			return nil, info, fmt.Errorf("claim %q: null entry", uid)
		}
		cl := &claimV5{UID: uid, Namespace: c.Namespace, Name: c.Name}
		for _, r := range c.Status.ReservedFor {
			p := claimstate.NewConsumer(r.APIGroup, r.Resource, r.Name, r.UID)
			cl.Consumers = append(cl.Consumers, consumerV5{APIGroup: p.APIGroup, Resource: p.Resource, Name: p.Name, UID: p.UID})
		}
		var results []nvResult
		if c.Status.Allocation != nil {
			results = c.Status.Allocation.Devices.Results
		}
		switch c.CheckpointState {
		case phaseCompleted:
			cl.Phase = phaseCompleted
			devices, err := nvidiaPrepared(c.PreparedDevices, results, sc.driverName)
			if err != nil {
				return nil, info, fmt.Errorf("claim %q: %w", uid, err)
			}
			cl.Devices = devices
		case phaseStarted:
			cl.Phase = phaseStarted
			for _, r := range results {
				if r.Driver != sc.driverName {
					continue
				}
				if r.Device == "" {
					return nil, info, fmt.Errorf("claim %q: allocation result of request %q names no device", uid, r.Request)
				}
				cl.Devices = append(cl.Devices, deviceV5{Requests: []string{r.Request}, Pool: r.Pool, Name: r.Device,
					AdminAccess: r.AdminAccess != nil && *r.AdminAccess, ShareID: deref(r.ShareID)})
			}
			if len(cl.Devices) == 0 {
				// Nothing set up, nothing held.
				info.skipped++
				continue
			}
			info.started++
		default:
			return nil, info, fmt.Errorf("claim %q: unknown checkpointState %q (allowed: %s, %s)", uid, c.CheckpointState, phaseStarted, phaseCompleted)
		}
		out.Claims[uid] = cl
	}
	return out, info, nil
}

// nvidiaPrepared converts the prepared devices of a completed claim, in
// NVIDIA's order (groups, then devices). What the prepared entries do not
// say comes from the claim's allocation result for the device: admin
// access, and the share ID of a share of a device allocated with consumable
// capacity (NVIDIA's driver prepares such a share without setting
// kubeletplugin.Device's ShareID, so the allocation is the only place that
// records it). Without the share, the kubelet's next Prepare of the claim
// (for gpu-0@<share>) would not match the record (gpu-0), and the share
// would hold its GPU exclusively.
func nvidiaPrepared(groups []*nvGroup, results []nvResult, driverName string) ([]deviceV5, error) {
	var out []deviceV5
	used := make([]bool, len(results))
	for gi, g := range groups {
		if g == nil {
			return nil, fmt.Errorf("prepared device group %d: null entry", gi)
		}
		for di, d := range g.Devices {
			var kd *nvKubeletDevice
			var dev deviceV5
			kinds := 0
			if d.GPU != nil {
				kinds++
				kd = d.GPU.Device
				if d.GPU.Info != nil {
					dev.UUID = d.GPU.Info.UUID
				}
			}
			if d.MIG != nil {
				kinds++
				kd = d.MIG.Device
				if d.MIG.Concrete != nil {
					dev.UUID, dev.ParentUUID = d.MIG.Concrete.MigUUID, d.MIG.Concrete.ParentUUID
				}
			}
			if d.VFIO != nil {
				kinds++
				kd = d.VFIO.Device
				if d.VFIO.Info != nil {
					dev.UUID = d.VFIO.Info.UUID
				}
			}
			// NVIDIA's own reader gives up on such an entry too: it cannot
			// tell which device the claim holds.
			if kinds != 1 || kd == nil || kd.DeviceName == "" {
				return nil, fmt.Errorf("prepared device %d of group %d names no single device (gpu, mig or vfio)", di, gi)
			}
			dev.Requests = append([]string{}, kd.Requests...)
			dev.Pool, dev.Name = kd.PoolName, kd.DeviceName
			dev.ShareID = deref(kd.ShareID)
			dev.CDIDeviceIDs = append([]string(nil), kd.CDIDeviceIDs...)
			if i := matchResult(results, used, driverName, dev); i >= 0 {
				used[i] = true
				r := results[i]
				dev.AdminAccess = r.AdminAccess != nil && *r.AdminAccess
				if dev.ShareID == "" {
					dev.ShareID = deref(r.ShareID)
				}
			}
			out = append(out, dev)
		}
	}
	return out, nil
}

// matchResult returns the index of the first allocation result not used
// yet that is dev's: the same driver, pool, device and request, and the
// same share where dev names one. Two shares of one device for one request
// are told apart by order: NVIDIA prepares a request's results in
// allocation order. It returns -1 when no result matches.
func matchResult(results []nvResult, used []bool, driverName string, dev deviceV5) int {
	for i, r := range results {
		if used[i] || r.Driver != driverName || r.Pool != dev.Pool || r.Device != dev.Name || !slices.Contains(dev.Requests, r.Request) {
			continue
		}
		if dev.ShareID != "" && deref(r.ShareID) != dev.ShareID {
			continue
		}
		return i
	}
	return -1
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// verifyNVIDIAChecksums checks a file's checksums the way NVIDIA's driver
// does at every read: the top-level one over its v1 view, and the one
// inside "v2", over the bytes as they stand in the file.
//
// The top-level checksum covers {"checksum":0,"v1":<v1>} (current
// releases), or the whole file with the checksum set to 0 (releases
// before the v2 section carried its own). The v2 checksum covers the v2
// section with its checksum set to 0. json.Marshal wrote both, so the
// checksum field is the section's first and the bytes are compact: setting
// the number to 0 in place gives exactly what NVIDIA hashed.
func verifyNVIDIAChecksums(data []byte, f *nvFile) error {
	want := *f.Checksum
	view := []byte(`{"checksum":0`)
	if isSection(f.V1) {
		view = append(append(append(view, `,"v1":`...), f.V1...), '}')
	} else {
		view = append(view, '}')
	}
	if KubeletChecksum(view) != want {
		whole, ok := zeroChecksum(bytes.TrimSpace(data), true)
		if !ok || KubeletChecksum(whole) != want {
			return fmt.Errorf("checksum %d does not match its content (the file was changed or is torn)", want)
		}
	}
	if !isSection(f.V2) {
		return nil
	}
	var head struct {
		Checksum *uint64 `json:"checksum"`
	}
	if err := json.Unmarshal(f.V2, &head); err != nil {
		return fmt.Errorf("v2: %w", err)
	}
	zeroed, ok := zeroChecksum(f.V2, false)
	if head.Checksum == nil || !ok {
		return errors.New("v2: no checksum where NVIDIA's driver writes it")
	}
	if KubeletChecksum(zeroed) != *head.Checksum {
		return fmt.Errorf("v2: checksum %d does not match its content (the file was changed or is torn)", *head.Checksum)
	}
	return nil
}

// zeroChecksum returns obj, a compact JSON object, with the number of its
// "checksum" field replaced by 0: the field must come first, or, with
// anywhere set, may follow a "version" field, as NVIDIA writes them.
func zeroChecksum(obj []byte, anywhere bool) ([]byte, bool) {
	const key = `"checksum":`
	i := bytes.Index(obj, []byte(key))
	if i < 0 || (!anywhere && i != 1) || (anywhere && !bytes.HasPrefix(obj, []byte(`{"checksum":`)) && !bytes.HasPrefix(obj, []byte(`{"version":`))) {
		return nil, false
	}
	start := i + len(key)
	end := start
	for end < len(obj) && obj[end] >= '0' && obj[end] <= '9' {
		end++
	}
	if end == start {
		return nil, false
	}
	out := make([]byte, 0, len(obj))
	out = append(append(append(out, obj[:start]...), '0'), obj[end:]...)
	return out, true
}

// KubeletChecksum is the checksum k8s.io/kubernetes'
// pkg/kubelet/checkpointmanager/checksum computes for a []byte, as NVIDIA's
// driver uses it: FNV-32a over the byte slice as go-spew prints it with
// "%#v" (the kubelet's hash printer), that is "([]uint8)[" followed by the
// bytes in decimal, separated by spaces, and "]".
func KubeletChecksum(data []byte) uint64 {
	h := fnv.New32a()
	buf := make([]byte, 0, 10+4*len(data))
	buf = append(buf, "([]uint8)["...)
	for i, b := range data {
		if i > 0 {
			buf = append(buf, ' ')
		}
		buf = strconv.AppendUint(buf, uint64(b), 10)
	}
	buf = append(buf, ']')
	_, _ = h.Write(buf)
	return uint64(h.Sum32())
}
