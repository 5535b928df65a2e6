package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The ComputeDomain and ComputeDomainClique kinds are custom resources, not
// opaque configs: they are registered by [AddResourcesToScheme], never by
// [AddToScheme], so that [Decode] refuses them as device parameters. Their
// schema is NVIDIA's (CRDs computedomains.resource.nvidia.com and
// computedomaincliques.resource.nvidia.com, version v1beta1; the YAML is in
// deployments/crds), so manifests written for NVIDIA's driver apply
// unchanged. gpudra's additions are optional fields, marked as such.

const (
	// ComputeDomainKind is the kind of [ComputeDomain].
	ComputeDomainKind = "ComputeDomain"
	// ComputeDomainCliqueKind is the kind of [ComputeDomainClique].
	ComputeDomainCliqueKind = "ComputeDomainClique"
	// ComputeDomainResource is the plural resource name of ComputeDomains.
	ComputeDomainResource = "computedomains"
	// ComputeDomainCliqueResource is the plural resource name of
	// ComputeDomainCliques.
	ComputeDomainCliqueResource = "computedomaincliques"
)

// ComputeDomainStatusValue is the readiness of a domain or of one node's
// IMEX daemon.
type ComputeDomainStatusValue = string

// Readiness values of [ComputeDomainStatus.Status] and
// [ComputeDomainNode.Status].
const (
	ComputeDomainStatusReady    ComputeDomainStatusValue = "Ready"
	ComputeDomainStatusNotReady ComputeDomainStatusValue = "NotReady"
)

// ChannelAllocationMode says how many IMEX channels a channel claim gets.
type ChannelAllocationMode = string

// The allocation modes of [ComputeDomainChannelSpec.AllocationMode] and
// [ComputeDomainChannelConfig.AllocationMode].
const (
	// ChannelAllocationModeSingle gives the container one channel, the
	// domain's. It is the default.
	ChannelAllocationModeSingle ChannelAllocationMode = "Single"
	// ChannelAllocationModeAll gives the container every channel of the
	// node, as NVIDIA's driver does; it forgoes the isolation between
	// domains that one channel per domain gives (docs/guides/computedomain.md).
	ChannelAllocationModeAll ChannelAllocationMode = "All"
)

// ChannelAllocationModes lists the allocation modes, sorted.
var ChannelAllocationModes = []ChannelAllocationMode{ChannelAllocationModeAll, ChannelAllocationModeSingle}

// ComputeDomain is a set of nodes of one multi-node NVLink fabric that run a
// workload sharing GPU memory over NVLink (an IMEX domain). The controller
// creates the ResourceClaimTemplate its spec names; pods whose claims come
// from that template get the domain's IMEX channel.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is immutable once created (the CRD refuses changes).
	Spec ComputeDomainSpec `json:"spec,omitempty"`
	// Status is derived by the controller from the domain's cliques; it
	// helps debugging, and workloads should not wait on it.
	Status ComputeDomainStatus `json:"status,omitempty"`
}

// ComputeDomainList is a list of ComputeDomains.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ComputeDomain `json:"items"`
}

// ComputeDomainSpec is what a user asks of a ComputeDomain.
type ComputeDomainSpec struct {
	// NumNodes is deprecated (NVIDIA deprecated it too). When above zero,
	// the domain is Ready once that many nodes' IMEX daemons are; it never
	// holds a pod back. Zero (the default) means Ready as soon as every
	// node that joined is.
	NumNodes int `json:"numNodes,omitempty"`
	// Channel says how pods get the domain's IMEX channel. Required.
	Channel *ComputeDomainChannelSpec `json:"channel"`
}

// ComputeDomainChannelSpec names the ResourceClaimTemplate the controller
// creates and how many channels its claims get.
type ComputeDomainChannelSpec struct {
	// ResourceClaimTemplate is created in the domain's namespace.
	ResourceClaimTemplate ComputeDomainResourceClaimTemplate `json:"resourceClaimTemplate"`
	// AllocationMode is Single (the default) or All.
	AllocationMode ChannelAllocationMode `json:"allocationMode,omitempty"`
}

// ComputeDomainResourceClaimTemplate names the ResourceClaimTemplate to
// create.
type ComputeDomainResourceClaimTemplate struct {
	Name string `json:"name"`
}

// ComputeDomainStatus is the derived state of a domain.
type ComputeDomainStatus struct {
	// Status is Ready or NotReady.
	Status ComputeDomainStatusValue `json:"status"`
	// Nodes are the nodes that joined, one entry per node (a map list keyed
	// by name).
	Nodes []*ComputeDomainNode `json:"nodes,omitempty"`
	// Conditions say why a domain is not Ready where a field of its spec is
	// at fault. gpudra's addition; optional.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Channel is the IMEX channel the domain's pods get on every node,
	// assigned by the controller, unique among the live domains of the
	// cluster; unset until assigned. gpudra's addition; optional. Only the
	// controller writes it (status subresource): the plugin trusts it to
	// keep domains apart, so it never comes from a claim's config.
	Channel *int32 `json:"channel,omitempty"`
}

// ComputeDomainNode is one node of a domain.
type ComputeDomainNode struct {
	Name      string `json:"name"`
	IPAddress string `json:"ipAddress"`
	CliqueID  string `json:"cliqueID"`
	// Index is the node's place in its clique: (CliqueID, Index) is unique,
	// and the node's IMEX DNS name derives from it, so it must never change
	// while the node stays in the domain.
	Index int `json:"index"`
	// Status is the readiness of the node's IMEX daemon.
	Status ComputeDomainStatusValue `json:"status,omitempty"`
}

// ComputeDomainClique holds the IMEX daemons of one clique of one domain.
// It lives in the driver's namespace and is named
// "<domain UID>.<clique ID>"; each node writes only its own entry.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainClique struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Daemons is a map list keyed by nodeName.
	Daemons []*ComputeDomainDaemonInfo `json:"daemons,omitempty"`
}

// ComputeDomainCliqueList is a list of ComputeDomainCliques.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainCliqueList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ComputeDomainClique `json:"items"`
}

// ComputeDomainDaemonInfo is one node's IMEX daemon in a clique.
type ComputeDomainDaemonInfo struct {
	NodeName  string `json:"nodeName"`
	IPAddress string `json:"ipAddress"`
	CliqueID  string `json:"cliqueID"`
	// Index: see [ComputeDomainNode.Index].
	Index int `json:"index"`
	// Status is the readiness of the daemon.
	Status ComputeDomainStatusValue `json:"status,omitempty"`
}

// ValidateComputeDomainSpec returns every problem of a domain's spec that
// the CRD schema lets through or that a cluster without the schema's
// defaults would (an empty template name, a mode the schema would refuse),
// each naming its field path. The controller reports them as a status
// condition and creates nothing for such a domain.
func ValidateComputeDomainSpec(spec *ComputeDomainSpec) field.ErrorList {
	path := field.NewPath("spec")
	var errs field.ErrorList
	if spec.NumNodes < 0 {
		errs = append(errs, field.Invalid(path.Child("numNodes"), spec.NumNodes, "must be zero or greater"))
	}
	if spec.Channel == nil {
		return append(errs, field.Required(path.Child("channel"), "the channel's resourceClaimTemplate.name"))
	}
	ch := path.Child("channel")
	name := spec.Channel.ResourceClaimTemplate.Name
	namePath := ch.Child("resourceClaimTemplate", "name")
	if name == "" {
		errs = append(errs, field.Required(namePath, "the name of the ResourceClaimTemplate to create"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(namePath, name, msg))
		}
	}
	switch spec.Channel.AllocationMode {
	case "", ChannelAllocationModeSingle, ChannelAllocationModeAll:
	default:
		errs = append(errs, field.NotSupported(ch.Child("allocationMode"), spec.Channel.AllocationMode, ChannelAllocationModes))
	}
	return errs
}
