// Package webhook is gpudra's validating admission webhook: it refuses a
// ResourceClaim, ResourceClaimTemplate or DeviceClass whose opaque config
// for one of gpudra's drivers the kubelet plugin would refuse at Prepare,
// when it is created, with the plugin's own message.
//
// The GPU driver's configs (GpuConfig, MigDeviceConfig, VfioDeviceConfig)
// are decoded and validated by [config.DecodeParameters] with
// [config.ValidationFeatures], the function and settings the plugin uses,
// so a message names the object path and then says exactly what the plugin
// would say:
//
//	spec.devices.config[0].opaque.parameters: unknown field "sharing.timeSlicingConfig.intervall"
//
// A claim's config whose kind cannot fit the devices its requests' classes
// select is refused too ([config.CheckFit]): gpudra's DeviceClasses
// (gpu.nvidia.com, mig.nvidia.com and mig-<profile>.nvidia.com,
// vfio.gpu.nvidia.com) each select one kind of device, so a MigDeviceConfig
// for a request of class gpu.nvidia.com is refused at creation. What the
// webhook cannot know at admission it leaves to the plugin: the device a
// request of another class, or a firstAvailable request, will get, and
// whether the node can carry a setting out.
//
// The handler reads resource.k8s.io/v1 objects only. It is registered with
// matchPolicy Equivalent and rules for v1, so the API server converts
// requests made through v1beta1 or v1beta2 to v1 before it calls the webhook.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// defaultNames are the drivers' names in NVIDIA's DRA driver, which gpudra
// uses by default.
var defaultNames = map[Driver]string{
	GPUDriver:           v1beta1.GPUDriverName,
	ComputeDomainDriver: v1beta1.ComputeDomainDriverName,
}

// DefaultDriverName returns the name d has unless configured otherwise.
func DefaultDriverName(d Driver) string { return defaultNames[d] }

// maxReviewBytes bounds an AdmissionReview: the API server refuses
// requests over 3 MiB, and a review carries the object twice at most.
const maxReviewBytes = 7 << 20

// resourceGroup is the API group of the objects the webhook validates.
const resourceGroup = "resource.k8s.io"

// resourceKind is a kind of object that carries opaque configs.
type resourceKind struct {
	// path is where the configs sit in the object.
	path *field.Path
	// configs decodes an object of the kind and returns its configs.
	configs func(raw []byte) ([]resourceapi.DeviceConfiguration, error)
}

// resourceKinds are the resource.k8s.io/v1 kinds the webhook validates.
var resourceKinds = map[string]resourceKind{
	"ResourceClaim": {
		path: field.NewPath("spec", "devices", "config"),
		configs: func(raw []byte) ([]resourceapi.DeviceConfiguration, error) {
			var obj resourceapi.ResourceClaim
			err := json.Unmarshal(raw, &obj)
			return claimConfigs(&obj.Spec), err
		},
	},
	"ResourceClaimTemplate": {
		path: field.NewPath("spec", "spec", "devices", "config"),
		configs: func(raw []byte) ([]resourceapi.DeviceConfiguration, error) {
			var obj resourceapi.ResourceClaimTemplate
			err := json.Unmarshal(raw, &obj)
			return claimConfigs(&obj.Spec.Spec), err
		},
	},
	"DeviceClass": {
		path: field.NewPath("spec", "config"),
		configs: func(raw []byte) ([]resourceapi.DeviceConfiguration, error) {
			var obj resourceapi.DeviceClass
			err := json.Unmarshal(raw, &obj)
			return classConfigs(&obj.Spec), err
		},
	},
}

// Handler is the admission handler: an [http.Handler] of
// admission.k8s.io/v1 AdmissionReviews.
type Handler struct {
	v validator
}

var _ http.Handler = &Handler{}

// Option configures a [Handler].
type Option func(*Handler)

// WithDriverName makes the handler validate the configs of d under name
// rather than its default name; an empty name turns d's validation off.
func WithDriverName(d Driver, name string) Option {
	return func(h *Handler) { h.v.nameOf[d] = name }
}

// NewHandler returns a handler that validates the configs of every driver
// under its default name, unless opts say otherwise.
func NewHandler(opts ...Option) (*Handler, error) {
	h := &Handler{v: validator{names: map[string]Driver{}, nameOf: map[Driver]string{}}}
	for d, name := range defaultNames {
		h.v.nameOf[d] = name
	}
	for _, opt := range opts {
		opt(h)
	}
	for d, name := range h.v.nameOf {
		if name == "" {
			continue
		}
		if other, taken := h.v.names[name]; taken {
			return nil, fmt.Errorf("drivers %s and %s have the same name %q", other, d, name)
		}
		h.v.names[name] = d
	}
	return h, nil
}

// DriverNames returns the driver names whose configs h validates, sorted.
func (h *Handler) DriverNames() []string {
	return slices.Sorted(maps.Keys(h.v.names))
}

var codecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := admissionv1.AddToScheme(s); err != nil {
		panic(err) // a programming error
	}
	return serializer.NewCodecFactory(s)
}()

var reviewGVK = admissionv1.SchemeGroupVersion.WithKind("AdmissionReview")

// ServeHTTP implements [http.Handler]. A request that is no
// admission.k8s.io/v1 AdmissionReview with a request gets status 400, and
// the API server applies the webhook's failurePolicy.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	if r.Method != http.MethodPost {
		http.Error(w, "POST an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil {
		http.Error(w, fmt.Sprintf("read request: %v", err), http.StatusBadRequest)
		return
	}
	if len(body) > maxReviewBytes {
		http.Error(w, fmt.Sprintf("AdmissionReview larger than %d bytes", maxReviewBytes), http.StatusRequestEntityTooLarge)
		return
	}
	review := &admissionv1.AdmissionReview{}
	_, gvk, err := codecs.UniversalDeserializer().Decode(body, nil, review)
	switch {
	case err != nil:
		http.Error(w, fmt.Sprintf("decode AdmissionReview: %v", err), http.StatusBadRequest)
		return
	case *gvk != reviewGVK:
		http.Error(w, fmt.Sprintf("got %s, want %s (admissionReviewVersions: [v1])", gvk, reviewGVK), http.StatusBadRequest)
		return
	case review.Request == nil:
		http.Error(w, "AdmissionReview has no request", http.StatusBadRequest)
		return
	}
	response := h.Admit(r.Context(), review.Request)
	response.UID = review.Request.UID
	out, err := json.Marshal(&admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: reviewGVK.GroupVersion().String(), Kind: reviewGVK.Kind},
		Response: response,
	})
	if err != nil {
		logger.Error(err, "Encode AdmissionReview response")
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if _, err := w.Write(out); err != nil {
		logger.V(2).Info("Write AdmissionReview response", "err", err)
	}
}

// Admit decides one admission request: it refuses a create, or an update
// that changes the configs, when an opaque config of one of the drivers
// is one the plugin would refuse. Other objects and operations are
// allowed.
func (h *Handler) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	logger := klog.FromContext(ctx).WithValues("kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "operation", req.Operation, "uid", req.UID)
	allowed := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind.Group != resourceGroup {
		return allowed
	}
	rk, ok := resourceKinds[req.Kind.Kind]
	if !ok {
		return allowed
	}
	if req.Kind.Version != resourceapi.SchemeGroupVersion.Version {
		// With matchPolicy Equivalent and rules for v1 this cannot happen;
		// refusing says how the webhook is misregistered rather than let
		// configs through unchecked.
		return denied(metav1.StatusReasonBadRequest, http.StatusBadRequest, fmt.Sprintf(
			"gpudra's webhook reads %s of %s/v1, not %s: register it with matchPolicy: Equivalent and rules for apiVersions [v1]",
			req.Kind.Kind, resourceGroup, req.Kind.Version), nil)
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return allowed
	}
	configs, err := rk.configs(req.Object.Raw)
	if err != nil {
		return denied(metav1.StatusReasonBadRequest, http.StatusBadRequest, fmt.Sprintf("decode %s: %v", req.Kind.Kind, err), nil)
	}
	if req.Operation == admissionv1.Update {
		// A claim's spec is immutable, but its metadata is not: an update
		// that leaves the configs alone (a finalizer removed) must pass
		// even for an object admitted before the webhook was installed.
		old, err := rk.configs(req.OldObject.Raw)
		if err == nil && equality.Semantic.DeepEqual(old, configs) {
			return allowed
		}
	}
	errs := h.v.validateConfigs(rk.path, configs)
	if decode := claimSpecs[req.Kind.Kind]; decode != nil && len(errs) == 0 {
		if spec, err := decode(req.Object.Raw); err == nil {
			errs = h.v.validateFit(rk.path, spec)
		}
	}
	if len(errs) == 0 {
		logger.V(5).Info("Admitted")
		return allowed
	}
	msgs := make([]string, len(errs))
	causes := make([]metav1.StatusCause, len(errs))
	for i, e := range errs {
		msgs[i] = e.String()
		causes[i] = metav1.StatusCause{Type: metav1.CauseTypeFieldValueInvalid, Field: e.path.String(), Message: e.err.Error()}
	}
	msg := strings.Join(msgs, "; ")
	logger.V(2).Info("Refused", "reason", msg)
	return denied(metav1.StatusReasonInvalid, http.StatusUnprocessableEntity, msg, causes)
}

// denied returns a refusal with msg, which the API server shows the user
// after `admission webhook "<name>" denied the request: `.
func denied(reason metav1.StatusReason, code int32, msg string, causes []metav1.StatusCause) *admissionv1.AdmissionResponse {
	status := &metav1.Status{Status: metav1.StatusFailure, Reason: reason, Code: code, Message: msg}
	if len(causes) > 0 {
		status.Details = &metav1.StatusDetails{Causes: causes}
	}
	return &admissionv1.AdmissionResponse{Allowed: false, Result: status}
}

// Resources are the resource.k8s.io resources the webhook validates, for
// the rules of its ValidatingWebhookConfiguration.
func Resources() []schema.GroupVersionResource {
	gv := resourceapi.SchemeGroupVersion
	return []schema.GroupVersionResource{
		gv.WithResource("resourceclaims"),
		gv.WithResource("resourceclaimtemplates"),
		gv.WithResource("deviceclasses"),
	}
}
