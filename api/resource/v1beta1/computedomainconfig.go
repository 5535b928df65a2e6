package v1beta1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ComputeDomainChannelConfig configures a channel device of driver
// compute-domain.nvidia.com: which domain the claim joins, and how many
// IMEX channels its containers get. The controller writes it into the
// ResourceClaimTemplate of each domain; a user may write it into a claim
// of their own.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainChannelConfig struct {
	metav1.TypeMeta `json:",inline"`
	// DomainID is the UID of the ComputeDomain. Required.
	DomainID string `json:"domainID"`
	// AllocationMode is Single or All; empty means Single.
	AllocationMode ChannelAllocationMode `json:"allocationMode,omitempty"`
}

// ComputeDomainDaemonConfig configures a daemon device of driver
// compute-domain.nvidia.com: which domain's IMEX daemon the claim runs.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainDaemonConfig struct {
	metav1.TypeMeta `json:",inline"`
	// DomainID is the UID of the ComputeDomain. Required.
	DomainID string `json:"domainID"`
}

// DefaultComputeDomainChannelConfig returns the config of a channel device
// no config applies to. It names no domain, so it does not validate: a
// channel claim must say which domain it joins.
func DefaultComputeDomainChannelConfig() *ComputeDomainChannelConfig {
	c := &ComputeDomainChannelConfig{TypeMeta: typeMeta(ComputeDomainChannelConfigKind)}
	c.Normalize()
	return c
}

// DefaultComputeDomainDaemonConfig returns the config of a daemon device no
// config applies to. Like the channel's, it does not validate.
func DefaultComputeDomainDaemonConfig() *ComputeDomainDaemonConfig {
	return &ComputeDomainDaemonConfig{TypeMeta: typeMeta(ComputeDomainDaemonConfigKind)}
}

// Normalize fills in allocationMode Single.
func (c *ComputeDomainChannelConfig) Normalize() {
	if c.AllocationMode == "" {
		c.AllocationMode = ChannelAllocationModeSingle
	}
}

// Validate checks c: a domain ID that is safe as a path segment and a
// label value, and a known allocation mode. f is not needed.
func (c *ComputeDomainChannelConfig) Validate(Features) error {
	errs := validateDomainID(c.DomainID, field.NewPath("domainID"))
	switch c.AllocationMode {
	case "", ChannelAllocationModeSingle, ChannelAllocationModeAll:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("allocationMode"), c.AllocationMode, ChannelAllocationModes))
	}
	return errs.ToAggregate()
}

// Normalize does nothing: a daemon config implies nothing.
func (c *ComputeDomainDaemonConfig) Normalize() {}

// Validate checks the domain ID. f is not needed.
func (c *ComputeDomainDaemonConfig) Validate(Features) error {
	return validateDomainID(c.DomainID, field.NewPath("domainID")).ToAggregate()
}

// validateDomainID refuses domain IDs that are empty or not label values:
// the plugin names files after them and labels nodes with them, and a label
// value is also one safe path segment (no "/", never "." or ".."). A
// ComputeDomain's UID always passes.
func validateDomainID(id string, path *field.Path) field.ErrorList {
	if id == "" {
		return field.ErrorList{field.Required(path, "the UID of the ComputeDomain")}
	}
	if msgs := validation.IsValidLabelValue(id); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(path, id, "must be the UID of a ComputeDomain: "+strings.Join(msgs, "; "))}
	}
	return nil
}
