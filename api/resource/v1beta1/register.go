package v1beta1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The DRA driver names whose opaque configs this package holds, shared
// with the NVIDIA DRA driver: the GPU driver's (GpuConfig, MigDeviceConfig,
// VfioDeviceConfig) and the ComputeDomain driver's
// (ComputeDomainChannelConfig, ComputeDomainDaemonConfig). They are the
// default driver names of gpudra's plugins, chart and tools.
const (
	GPUDriverName           = "gpu.nvidia.com"
	ComputeDomainDriverName = "compute-domain.nvidia.com"
)

const (
	// GroupName is the API group of the opaque configs, shared with the
	// NVIDIA DRA driver.
	GroupName = "resource.nvidia.com"
	// Version is the API version of this package.
	Version = "v1beta1"

	// GpuConfigKind is the kind of [GpuConfig].
	GpuConfigKind = "GpuConfig"
	// MigDeviceConfigKind is the kind of [MigDeviceConfig].
	MigDeviceConfigKind = "MigDeviceConfig"
	// VfioDeviceConfigKind is the kind of [VfioDeviceConfig].
	VfioDeviceConfigKind = "VfioDeviceConfig"
	// ComputeDomainChannelConfigKind is the kind of
	// [ComputeDomainChannelConfig].
	ComputeDomainChannelConfigKind = "ComputeDomainChannelConfig"
	// ComputeDomainDaemonConfigKind is the kind of
	// [ComputeDomainDaemonConfig].
	ComputeDomainDaemonConfigKind = "ComputeDomainDaemonConfig"
)

// SchemeGroupVersion is the group and version of every kind in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

var (
	// SchemeBuilder registers the kinds of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the config kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme

	// ResourcesSchemeBuilder registers the custom resources of this package
	// (ComputeDomain, ComputeDomainClique) with a scheme. They are kept out
	// of SchemeBuilder so that Decode never takes one for device
	// parameters.
	ResourcesSchemeBuilder = runtime.NewSchemeBuilder(addResourceTypes)
	// AddResourcesToScheme adds the custom resources of this package to a
	// scheme.
	AddResourcesToScheme = ResourcesSchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&GpuConfig{},
		&MigDeviceConfig{},
		&VfioDeviceConfig{},
		&ComputeDomainChannelConfig{},
		&ComputeDomainDaemonConfig{},
	)
	return nil
}

func addResourceTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&ComputeDomain{},
		&ComputeDomainList{},
		&ComputeDomainClique{},
		&ComputeDomainCliqueList{},
	)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// Config is implemented by every configuration kind of this package, so
// that config resolution can handle them alike.
type Config interface {
	runtime.Object
	// Normalize fills in the values the config implies; it is idempotent.
	Normalize()
	// Validate returns every problem of the config, each naming its field
	// path and the allowed values, or nil. It expects a normalized config
	// but accepts any.
	Validate(f Features) error
}

// scheme holds exactly the kinds of this package; Decode creates objects
// from it, so registering a kind in addKnownTypes is all a new kind needs to
// become decodable.
var scheme = newScheme()

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		panic(err) // addKnownTypes cannot fail; a failure is a programming error.
	}
	return s
}

// Kinds returns the kinds Decode accepts, sorted.
func Kinds() []string {
	var kinds []string
	for gvk := range scheme.AllKnownTypes() {
		if gvk.GroupVersion() == SchemeGroupVersion {
			kinds = append(kinds, gvk.Kind)
		}
	}
	slices.Sort(kinds)
	return kinds
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: kind}
}
