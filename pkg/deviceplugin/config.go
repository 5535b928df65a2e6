// Package deviceplugin is gpudra's classic device-plugin mode: the
// kubelet's device-plugin API v1beta1 (nvidia.com/gpu, MIG resources under
// NVIDIA's strategies, time-slicing replicas) served from the same
// discovery and device model as the DRA plugin.
package deviceplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// Config is NVIDIA's device-plugin config file (its api/config/v1), the
// part gpudra serves: the same file works with both.
type Config struct {
	Version string  `json:"version"`
	Flags   Flags   `json:"flags"`
	Sharing Sharing `json:"sharing"`
}

// Flags are the config file's flags; command-line flags override them.
type Flags struct {
	MigStrategy      *string      `json:"migStrategy,omitempty"`
	FailOnInitError  *bool        `json:"failOnInitError,omitempty"`
	NvidiaDriverRoot *string      `json:"nvidiaDriverRoot,omitempty"`
	Plugin           *PluginFlags `json:"plugin,omitempty"`
}

// PluginFlags are the flags of the device plugin proper.
type PluginFlags struct {
	PassDeviceSpecs     *bool    `json:"passDeviceSpecs,omitempty"`
	DeviceListStrategy  []string `json:"deviceListStrategy,omitempty"`
	DeviceIDStrategy    *string  `json:"deviceIDStrategy,omitempty"`
	CDIAnnotationPrefix *string  `json:"cdiAnnotationPrefix,omitempty"`
	ContainerDriverRoot *string  `json:"containerDriverRoot,omitempty"`
}

// Sharing says which resources are shared, and how.
type Sharing struct {
	TimeSlicing ReplicatedResources  `json:"timeSlicing"`
	MPS         *ReplicatedResources `json:"mps,omitempty"`
}

// ReplicatedResources are resources advertised several times per device.
type ReplicatedResources struct {
	// Strategy exists in NVIDIA's format with one value, "".
	Strategy string `json:"strategy,omitempty"`
	// RenameByDefault advertises each replicated resource as
	// <name>.shared unless it has a Rename.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne refuses a container asking for more than
	// one replica: two replicas of one GPU are not twice the GPU.
	FailRequestsGreaterThanOne bool              `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicaResource `json:"resources,omitempty"`
}

// ReplicaResource is one resource and how many replicas of its devices.
type ReplicaResource struct {
	Name     string         `json:"name"`
	Rename   string         `json:"rename,omitempty"`
	Devices  ReplicaDevices `json:"devices"`
	Replicas int            `json:"replicas"`
}

// ReplicaDevices says which devices of the resource are replicated: all
// (the default), the first Count, or those List names (GPU index "0", MIG
// index "0:1", or UUID).
type ReplicaDevices struct {
	All   bool
	Count int
	List  []string
}

// UnmarshalJSON reads "all", a count, or a list.
func (d *ReplicaDevices) UnmarshalJSON(b []byte) error {
	*d = ReplicaDevices{}
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != "all" {
			return fmt.Errorf("%q: must be \"all\", a count, or a list of GPU indices, MIG indices (<gpu>:<mig>) or UUIDs", s)
		}
		d.All = true
		return nil
	}
	var n int
	if json.Unmarshal(b, &n) == nil {
		if n <= 0 {
			return fmt.Errorf("%d: a count of devices must be positive", n)
		}
		d.Count = n
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("%s: must be \"all\", a count, or a list of GPU indices, MIG indices (<gpu>:<mig>) or UUIDs", b)
	}
	for i, raw := range list {
		var idx uint
		if json.Unmarshal(raw, &idx) == nil {
			d.List = append(d.List, strconv.FormatUint(uint64(idx), 10))
			continue
		}
		var ref string
		if json.Unmarshal(raw, &ref) != nil || !deviceRef().MatchString(ref) {
			return fmt.Errorf("[%d]: %s is no GPU index, MIG index (<gpu>:<mig>) or GPU/MIG UUID", i, raw)
		}
		d.List = append(d.List, ref)
	}
	if len(d.List) == 0 {
		return errors.New("[]: an empty list replicates nothing; leave devices out for all")
	}
	return nil
}

// MarshalJSON writes the form UnmarshalJSON reads.
func (d ReplicaDevices) MarshalJSON() ([]byte, error) {
	switch {
	case d.Count > 0:
		return json.Marshal(d.Count)
	case len(d.List) > 0:
		return json.Marshal(d.List)
	}
	return json.Marshal("all")
}

// deviceRef matches a GPU index, a MIG index and a GPU or MIG UUID
// (MIG-<uuid>, or the old MIG-GPU-<uuid>/<gi>/<ci>). Compiled at first
// use: its repetitions make a 46 KB program that the DRA plugin, which
// links this package, would otherwise build at every start.
var deviceRef = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^([0-9]+|[0-9]+:[0-9]+|GPU-[0-9a-fA-F-]{36}|MIG-[0-9a-fA-F-]{36}|MIG-GPU-[0-9a-fA-F-]{36}/[0-9]+/[0-9]+)$`)
})

// The values of the flags gpudra takes from NVIDIA's device plugin.
const (
	MIGStrategyNone   = "none"
	MIGStrategySingle = "single"
	MIGStrategyMixed  = "mixed"

	DeviceListEnvVar         = "envvar"
	DeviceListCDICRI         = "cdi-cri"
	DeviceListCDIAnnotations = "cdi-annotations"

	DeviceIDUUID  = "uuid"
	DeviceIDIndex = "index"
)

var (
	MIGStrategies        = []string{MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed}
	DeviceListStrategies = []string{DeviceListEnvVar, DeviceListCDICRI, DeviceListCDIAnnotations}
	DeviceIDStrategies   = []string{DeviceIDUUID, DeviceIDIndex}
)

// ResourceGPU is the resource of full GPUs (and, with the single MIG
// strategy, of MIG devices).
const ResourceGPU = "nvidia.com/gpu"

// resourceName is what Kubernetes accepts as an extended resource name
// under nvidia.com; compiled at first use, as deviceRef.
var resourceName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
})

// ParseConfig reads a config file (YAML or JSON), strictly: an unknown
// field is an error naming it. It checks what can be checked without the
// node's GPUs; [Plan] checks the rest.
func ParseConfig(data []byte) (*Config, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	cfg := &Config{}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil, errors.New("empty config: want at least version: v1")
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return nil, explainDecode(err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// LoadConfig reads the config file at path.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return cfg, nil
}

// explainDecode turns encoding/json's errors into ones naming the field.
func explainDecode(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Errorf("%s: got a JSON %s, want %s", typeErr.Field, typeErr.Value, typeErr.Type)
	}
	if msg, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fmt.Errorf("unknown field %s (gpudra's device-plugin mode reads version, flags.migStrategy, flags.failOnInitError, flags.nvidiaDriverRoot, flags.plugin.{passDeviceSpecs,deviceListStrategy,deviceIDStrategy,cdiAnnotationPrefix,containerDriverRoot}, sharing.timeSlicing and sharing.mps)", msg)
	}
	return err
}

// Validate checks the config without the node's GPUs.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Version != "v1" {
		add("version %q: must be v1", c.Version)
	}
	if s := c.Flags.MigStrategy; s != nil && !slices.Contains(MIGStrategies, *s) {
		add("flags.migStrategy %q: must be one of %s", *s, strings.Join(MIGStrategies, ", "))
	}
	if p := c.Flags.Plugin; p != nil {
		for i, s := range p.DeviceListStrategy {
			if !slices.Contains(DeviceListStrategies, s) {
				add("flags.plugin.deviceListStrategy[%d] %q: must be one of %s", i, s, strings.Join(DeviceListStrategies, ", "))
			}
		}
		if s := p.DeviceIDStrategy; s != nil && !slices.Contains(DeviceIDStrategies, *s) {
			add("flags.plugin.deviceIDStrategy %q: must be one of %s", *s, strings.Join(DeviceIDStrategies, ", "))
		}
	}
	if c.Sharing.MPS != nil && len(c.Sharing.MPS.Resources) > 0 {
		if len(c.Sharing.TimeSlicing.Resources) > 0 {
			add("sharing: timeSlicing and mps both replicate resources; a node shares its GPUs one way (NVIDIA's device plugin takes one too)")
		}
		errs = append(errs, validateReplicated("sharing.mps", c.Sharing.MPS, true)...)
	}
	errs = append(errs, validateReplicated("sharing.timeSlicing", &c.Sharing.TimeSlicing, false)...)
	return errors.Join(errs...)
}

// validateReplicated checks one sharing strategy's resources; under MPS
// only full GPUs are shared (an MPS daemon per GPU, as NVIDIA's).
func validateReplicated(field string, ts *ReplicatedResources, mps bool) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if ts.Strategy != "" {
		add("%s.strategy %q: must be empty", field, ts.Strategy)
	}
	seen := map[string]bool{}
	for i, r := range ts.Resources {
		path := fmt.Sprintf("%s.resources[%d]", field, i)
		if mps && strings.HasPrefix(r.Name, "nvidia.com/mig-") {
			add("%s.name %q: MPS replicas are served for full GPUs only; share a MIG device through DRA (MigDeviceConfig sharing.strategy: MPS)", path, r.Name)
		}
		switch {
		case r.Name == "":
			add("%s.name: required (%s or nvidia.com/mig-<profile>)", path, ResourceGPU)
		case !resourceName().MatchString(r.Name):
			add("%s.name %q: must be %s or nvidia.com/mig-<profile>", path, r.Name, ResourceGPU)
		case seen[r.Name]:
			add("%s.name %q: given twice", path, r.Name)
		}
		seen[r.Name] = true
		if r.Replicas < 1 {
			add("%s.replicas %d: must be at least 1", path, r.Replicas)
		}
		if r.Rename != "" && !resourceName().MatchString(r.Rename) {
			add("%s.rename %q: must be a resource name under nvidia.com/", path, r.Rename)
		}
	}
	return errs
}
