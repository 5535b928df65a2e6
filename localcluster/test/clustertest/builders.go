package clustertest

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// TestImage is the image of the containers the builders write: the local
// cluster's simulated nodes run no container, so any name serves, and this
// one reads as what a user would write.
const TestImage = "ubuntu:24.04"

// Request returns a request named name of one device of the DeviceClass
// class, narrowed by the CEL selectors.
func Request(name, class string, cel ...string) resourceapi.DeviceRequest {
	req := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}
	for _, e := range cel {
		req.Exactly.Selectors = append(req.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return req
}

// Config returns an opaque configuration of driver for the named
// requests (none: all of the claim's), its parameters params marshalled
// as JSON: a typed config of the driver's API (e.g. a v1beta1.GpuConfig),
// or a json.RawMessage for parameters a test writes wrong on purpose.
func Config(tb testing.TB, driver string, params any, requests ...string) resourceapi.DeviceClaimConfiguration {
	tb.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		tb.Fatalf("marshal the parameters of %s: %v", driver, err)
	}
	return resourceapi.DeviceClaimConfiguration{
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: raw},
		}},
	}
}

// Spec returns the spec of a claim with the requests; a test that
// configures them appends to its Devices.Config (see [Config]).
func Spec(requests ...resourceapi.DeviceRequest) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}}
}

// Claim returns the ResourceClaim ns/name with spec.
func Claim(ns, name string, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       spec,
	}
}

// ClaimTemplate returns the ResourceClaimTemplate ns/name whose claims
// have spec.
func ClaimTemplate(ns, name string, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}
}

// PodClaim is how a pod refers to its claim: by the name of an existing
// ResourceClaim or of a ResourceClaimTemplate to make one from.
type PodClaim struct {
	// Claim names a ResourceClaim of the pod's namespace.
	Claim string
	// Template names a ResourceClaimTemplate of the pod's namespace.
	Template string
}

// Pod returns the pod ns/name of one container "ctr" ([TestImage]) that
// uses the pod claim "gpu", made as c says.
func Pod(ns, name string, c PodClaim) *corev1.Pod {
	claim := corev1.PodResourceClaim{Name: "gpu"}
	if c.Claim != "" {
		claim.ResourceClaimName = ptr.To(c.Claim)
	}
	if c.Template != "" {
		claim.ResourceClaimTemplateName = ptr.To(c.Template)
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:      "ctr",
				Image:     TestImage,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{claim},
		},
	}
}

// Namespace returns the Namespace name.
func Namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}
}
