// Package deviceclasses holds gpudra's DeviceClasses: the YAML files in
// this directory are the one source of truth, embedded here for the local
// cluster and the tests, and copied into the Helm chart as
// deployments/helm/gpudra/files/deviceclasses (the chart substitutes the
// driver name and can drop extendedResourceName; see its values.yaml).
//
// The selectors are those of NVIDIA's DRA driver, so that claims written
// for it select the same devices under gpudra. They name the default
// driver name, gpu.nvidia.com. Besides NVIDIA's three classes there is one
// class per MIG profile (mig-<profile>.nvidia.com, generated from the
// simulated models' MIG tables by TestMIGProfileClasses), whose
// extendedResourceName nvidia.com/mig-<profile> lets pods written for
// NVIDIA's device plugin (mixed strategy) run unchanged on DRA nodes.
//
// The classes of the ComputeDomain driver (compute-domain.nvidia.com) are
// in the subdirectory computedomain, apart from the GPU driver's: they are
// installed with that driver ([ComputeDomain]), not by [All].
package deviceclasses

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

//go:embed *.yaml
var files embed.FS

//go:embed computedomain/*.yaml
var computeDomainFiles embed.FS

// Names of the DeviceClasses, sorted.
const (
	GPU  = v1beta1.GPUDriverName
	MIG  = "mig.nvidia.com"
	VFIO = "vfio.gpu.nvidia.com"

	// ComputeDomainDaemon and ComputeDomainChannel are the classes of
	// driver compute-domain.nvidia.com.
	ComputeDomainDaemon  = "compute-domain-daemon.nvidia.com"
	ComputeDomainChannel = "compute-domain-default-channel.nvidia.com"
)

// All returns a fresh copy of every DeviceClass of the GPU driver, sorted
// by name.
func All() ([]*resourceapi.DeviceClass, error) {
	return load(files, ".")
}

// ComputeDomain returns a fresh copy of every DeviceClass of the
// ComputeDomain driver, sorted by name.
func ComputeDomain() ([]*resourceapi.DeviceClass, error) {
	return load(computeDomainFiles, "computedomain")
}

func load(files embed.FS, dir string) ([]*resourceapi.DeviceClass, error) {
	names, err := fs.Glob(files, path.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	classes := make([]*resourceapi.DeviceClass, 0, len(names))
	for _, name := range names {
		data, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		class := &resourceapi.DeviceClass{}
		if err := yaml.UnmarshalStrict(data, class); err != nil {
			return nil, fmt.Errorf("DeviceClass file %s: %w", name, err)
		}
		if want := strings.TrimSuffix(path.Base(name), ".yaml"); class.Name != want {
			return nil, fmt.Errorf("DeviceClass file %s holds class %q; the file must be named after its class", name, class.Name)
		}
		classes = append(classes, class)
	}
	return classes, nil
}

// Files returns the YAML files, by file name, for tools that apply them
// as they are.
func Files() fs.FS { return files }
