package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/timeslicing"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// observed is the node as an observer finds it on disk and in /proc: the
// plugin's checkpoint and CDI specs, the simulated hardware's state, the
// MPS daemons that run, and what the API server has published. The
// harness reads it while the plugin is dead (after a kill), or for
// claims that no call is in flight for.
type observed struct {
	claims map[string]*ckptClaim // the checkpoint, by claim UID
	specs  map[string]*spec      // CDI specs, by claim UID
	// metadata are the CDI device IDs of the device-metadata specs the
	// kubeletplugin helper wrote beside gpudra's own (KEP-5304).
	metadata map[string]bool
	nvml     *sim.State
	sysfs    *fakesysfs.State
	slices   map[string]v1beta1.TimeSliceInterval // by GPU UUID
	daemons  map[string][]int                     // MPS control daemons alive, by ID
	devices  map[string]*published                // by device name
	sets     map[string]map[string]int64          // shared counters: set -> counter -> capacity
	// lost: the checkpoint is lost and its claims not adopted yet (the
	// adopt-pending marker is there, or checkpoint.json is missing beside
	// CDI specs, unreadable or no regular file): claims then holds
	// nothing, and only the CDI specs say what is prepared.
	lost string
}

// ckptClaim is a claim of the checkpoint file, read as the file says
// (an independent reading of the v2/v5 format, docs/design/checkpoint.md).
type ckptClaim struct {
	UID     string `json:"uid"`
	Phase   string `json:"phase"`
	Adopted bool   `json:"adopted"`
	// StartedAt is when the preparation started (a started record) or
	// finished (a completed one), by the plugin's clock.
	StartedAt time.Time                  `json:"startedAt"`
	Devices   []ckptDevice               `json:"devices"`
	Records   map[string]json.RawMessage `json:"records"`
}

type ckptDevice struct {
	Name        string `json:"name"`
	ShareID     string `json:"shareID"`
	AdminAccess bool   `json:"adminAccess"`
	UUID        string `json:"uuid"`
}

// spec is a claim's CDI spec.
type spec struct {
	content cdi.SpecContent
	raw     *cdispec.Spec
}

// published is a device the API server has in the node's pool.
type published struct {
	attrs    map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	consumes []resourceapi.DeviceCounterConsumption
}

func (p *published) str(name string) string {
	if a, ok := p.attrs[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func (p *published) int(name string) int {
	if a, ok := p.attrs[resourceapi.QualifiedName(name)]; ok && a.IntValue != nil {
		return int(*a.IntValue)
	}
	return -1
}

// pool is the node's published pool: its devices by name and its counter
// sets (set -> counter -> capacity).
type pool struct {
	devices map[string]*published
	sets    map[string]map[string]int64
}

// observe reads the node. The pool is the one published at the start,
// which must not change (the end of each trial checks it): during an API
// outage the API server may have none.
func (n *node) observe(p pool) (*observed, error) {
	o := &observed{specs: map[string]*spec{}, metadata: map[string]bool{}, devices: p.devices, sets: p.sets}
	var err error
	var missing bool
	if o.claims, missing, o.lost, err = readCheckpoint(filepath.Join(n.pluginDir(), checkpoint.FileName)); err != nil {
		return nil, err
	}
	if err := o.readSpecs(n.cdiDir()); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(filepath.Join(n.pluginDir(), checkpoint.AdoptPendingFileName)); err == nil {
		o.lost = "adoption pending"
	} else if missing && len(o.specs) > 0 && o.lost == "" {
		o.lost = "missing beside CDI specs"
	}
	if o.lost != "" {
		o.claims = map[string]*ckptClaim{}
	}
	if o.nvml, err = sim.ReadState(n.nvmlState()); err != nil {
		return nil, err
	}
	if o.sysfs, err = fakesysfs.ReadState(n.sysfsState()); err != nil {
		return nil, err
	}
	if o.slices, err = timeslicing.ReadIntervals(n.timeSlicesState()); err != nil {
		return nil, err
	}
	if o.daemons, err = mpsDaemons(n.mpsRoot()); err != nil {
		return nil, err
	}
	return o, nil
}

// readCheckpoint reads the checkpoint file. missing: there is none;
// lost (with no error) says why what is there is no checkpoint the
// plugin can read (damage, chaos/damage.go), as the plugin would find it.
func readCheckpoint(path string) (claims map[string]*ckptClaim, missing bool, lost string, err error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]*ckptClaim{}, true, "", nil
	}
	if err != nil {
		return nil, false, "", err
	}
	if !fi.Mode().IsRegular() {
		return nil, false, fmt.Sprintf("no regular file (%v)", fi.Mode().Type()), nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]*ckptClaim{}, true, "", nil // moved aside since
	}
	if err != nil {
		return nil, false, "", err
	}
	var f struct {
		Version string                `json:"version"`
		Claims  map[string]*ckptClaim `json:"claims"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, false, fmt.Sprintf("unreadable: %v", err), nil
	}
	if f.Version != "v2" && f.Version != "v5" {
		return nil, false, "", fmt.Errorf("checkpoint %s: version %q, the harness reads v2 and v5", path, f.Version)
	}
	if f.Claims == nil {
		f.Claims = map[string]*ckptClaim{}
	}
	return f.Claims, false, "", nil
}

func (o *observed) readSpecs(dir string) error {
	w, err := cdi.NewWriter(dir, driverName)
	if err != nil {
		return err
	}
	uids, err := w.ClaimUIDs()
	if err != nil {
		return err
	}
	for _, uid := range uids {
		content, err := w.Read(uid)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing (the plugin runs)
		}
		if err != nil {
			return err
		}
		raw, err := cdiapi.ReadSpec(w.Path(uid), 0)
		if err != nil {
			return fmt.Errorf("CDI spec of claim %s: %w", uid, err)
		}
		o.specs[uid] = &spec{content: content, raw: raw.Spec}
	}
	// The helper names its specs <driver>_metadata_<claim UID>_<request>.json.
	paths, err := filepath.Glob(filepath.Join(dir, driverName+"_metadata_*.json"))
	if err != nil {
		return err
	}
	for _, path := range paths {
		raw, err := cdiapi.ReadSpec(path, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			return fmt.Errorf("device metadata CDI spec %s: %w", path, err)
		}
		for _, d := range raw.Devices {
			o.metadata[raw.Kind+"="+d.Name] = true
		}
	}
	return nil
}

// mpsDaemons finds the MPS control daemons that run for the node, by
// ID, in /proc: the processes of the control binary that run in the
// background (the fake's daemons) with a pipe directory under root. It
// does not trust the pid files: a daemon whose files are gone still runs.
func mpsDaemons(root string) (map[string][]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[string][]int{}
	prefix := root + string(filepath.Separator)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(cmdline), "\x00")
		if filepath.Base(argv0) != mps.DefaultControlBinary {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		var pipe string
		background := false
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, mps.EnvPipeDirectory+"="); ok {
				pipe = v
			}
			if kv == "FAKE_MPS_BACKGROUND=1" {
				background = true
			}
		}
		if !background || !strings.HasPrefix(pipe, prefix) || !pidAlive(pid) {
			continue
		}
		id := filepath.Base(filepath.Dir(pipe))
		out[id] = append(out[id], pid)
	}
	return out, nil
}

// listSlices lists the node's ResourceSlices from the API server.
func (n *node) listSlices(ctx context.Context) ([]*resourceapi.ResourceSlice, error) {
	list, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		return nil, err
	}
	out := make([]*resourceapi.ResourceSlice, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// index returns the devices of the newest generation of the pool, and
// its counter sets.
func index(list []*resourceapi.ResourceSlice) pool {
	var gen int64
	for _, s := range list {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	devices, sets := map[string]*published{}, map[string]map[string]int64{}
	for _, s := range list {
		if s.Spec.Pool.Generation != gen {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			sets[cs.Name] = map[string]int64{}
			for name, c := range cs.Counters {
				sets[cs.Name][name] = c.Value.Value()
			}
		}
		for _, d := range s.Spec.Devices {
			devices[d.Name] = &published{attrs: d.Attributes, consumes: d.ConsumesCounters}
		}
	}
	return pool{devices: devices, sets: sets}
}

// deviceNames returns the published device names, sorted.
func deviceNames(devices map[string]*published) []string {
	return slices.Sorted(maps.Keys(devices))
}
