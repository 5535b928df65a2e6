package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpudra/gpudra/pkg/claimconfig"
)

const (
	gpuDriver = "gpu.nvidia.com"
	cdDriver  = "compute-domain.nvidia.com"

	goodGPU = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`
	// misspelt is GpuConfig with "intervall" for "interval".
	misspelt  = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"intervall":"Long"}}}`
	wrongKind = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GPUConfig"}`
	badVFIO   = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig","iommu":{"backendPolicy":"Iommufd"}}`
	goodVFIO  = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig","iommu":{"backendPolicy":"PreferIommuFD"}}`
	// goodChannel is what the ComputeDomain controller writes into its
	// claim templates; misspeltChannel has "domainId" for "domainID".
	goodChannel     = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainChannelConfig","domainID":"0b6f4a2e-1c55-4f0e-9b1a-3f1d2c4e5a6b"}`
	misspeltChannel = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainChannelConfig","domainId":"0b6f4a2e-1c55-4f0e-9b1a-3f1d2c4e5a6b"}`
	goodMIG         = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`
	notObject       = `"{\"apiVersion\": "`
)

func opaque(driver, params string) resourceapi.DeviceConfiguration {
	return resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}
}

func claim(configs ...resourceapi.DeviceConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}}
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}
	for _, cfg := range configs {
		c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{DeviceConfiguration: cfg})
	}
	return c
}

// withRequests replaces c's requests with exactly-requests given as name,
// class pairs.
func withRequests(c *resourceapi.ResourceClaim, nameClass ...string) *resourceapi.ResourceClaim {
	c.Spec.Devices.Requests = nil
	for i := 0; i < len(nameClass); i += 2 {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: nameClass[i], Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nameClass[i+1]}})
	}
	return c
}

func template(configs ...resourceapi.DeviceConfiguration) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: claim(configs...).Spec}}
}

func class(configs ...resourceapi.DeviceConfiguration) *resourceapi.DeviceClass {
	c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}}
	for _, cfg := range configs {
		c.Spec.Config = append(c.Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: cfg})
	}
	return c
}

// pluginMessage is the kubelet plugin's message for parameters.
func pluginMessage(t *testing.T, params string) string {
	t.Helper()
	_, err := claimconfig.DecodeParameters([]byte(params), claimconfig.ValidationFeatures)
	if err == nil {
		t.Fatalf("the plugin accepts %s", params)
	}
	return err.Error()
}

// request is an AdmissionRequest for obj (and old, for an update).
func request(t *testing.T, kind metav1.GroupVersionKind, op admissionv1.Operation, obj, old any) *admissionv1.AdmissionRequest {
	t.Helper()
	raw := func(o any) runtime.RawExtension {
		if o == nil {
			return runtime.RawExtension{}
		}
		data, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: data}
	}
	return &admissionv1.AdmissionRequest{UID: types.UID("uid-1"), Kind: kind, Operation: op, Object: raw(obj), OldObject: raw(old)}
}

func v1Kind(kind string) metav1.GroupVersionKind {
	return metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: kind}
}

// review posts a review of req to h and returns the response.
func review(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(&admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil {
		t.Fatalf("response %s is no AdmissionReview with a response", rec.Body)
	}
	if out.Response.UID != req.UID {
		t.Errorf("response UID %q, want the request's %q", out.Response.UID, req.UID)
	}
	return out.Response
}

func newHandler(t *testing.T, opts ...Option) *Handler {
	t.Helper()
	h, err := NewHandler(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestAdmit(t *testing.T) {
	h := newHandler(t)
	const claimPath = "spec.devices.config"
	tests := map[string]struct {
		req  *admissionv1.AdmissionRequest
		want string // "" for allowed
	}{
		"good GpuConfig": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, goodGPU)), nil),
		},
		"good MigDeviceConfig and VfioDeviceConfig": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Create, withRequests(claim(opaque(gpuDriver, goodMIG), opaque(gpuDriver, goodVFIO)),
				"mig", "mig-1g.10gb.nvidia.com", "vfio", "vfio.gpu.nvidia.com"), nil),
		},
		"misspelt field": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, misspelt)), nil),
			want: claimPath + "[0].opaque.parameters: " + pluginMessage(t, misspelt),
		},
		"unknown kind": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, goodGPU), opaque(gpuDriver, wrongKind)), nil),
			want: claimPath + "[1].opaque.parameters: " + pluginMessage(t, wrongKind),
		},
		"invalid VfioDeviceConfig": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, badVFIO)), nil),
			want: claimPath + "[0].opaque.parameters: " + pluginMessage(t, badVFIO),
		},
		"parameters not a JSON object": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, notObject)), nil),
			want: claimPath + "[0].opaque.parameters: " + pluginMessage(t, notObject),
		},
		"GpuConfig for the ComputeDomain driver": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(cdDriver, goodGPU)), nil),
			want: claimPath + "[0].opaque.parameters: kind GpuConfig configures devices of driver gpu.nvidia.com, not compute-domain.nvidia.com",
		},
		"ComputeDomain channel config": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(cdDriver, goodChannel)), nil),
		},
		"ComputeDomain daemon config": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(cdDriver, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainDaemonConfig","domainID":"x"}`)), nil),
		},
		"ComputeDomain channel config with domainId misspelt": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(cdDriver, misspeltChannel)), nil),
			want: claimPath + "[0].opaque.parameters: " + pluginMessage(t, misspeltChannel),
		},
		"ComputeDomain channel config for the GPU driver": {
			req:  request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, goodChannel)), nil),
			want: claimPath + "[0].opaque.parameters: kind ComputeDomainChannelConfig configures devices of driver compute-domain.nvidia.com, not gpu.nvidia.com",
		},
		"config of another driver ignored": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque("nic.example.com", misspelt), opaque(gpuDriver, goodGPU)), nil),
		},
		"every bad config named": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(gpuDriver, misspelt), opaque("nic.example.com", misspelt), opaque(gpuDriver, badVFIO)), nil),
			want: claimPath + "[0].opaque.parameters: " + pluginMessage(t, misspelt) + "; " +
				claimPath + "[2].opaque.parameters: " + pluginMessage(t, badVFIO),
		},
		"template": {
			req:  request(t, v1Kind("ResourceClaimTemplate"), admissionv1.Create, template(opaque(gpuDriver, goodGPU), opaque(gpuDriver, misspelt)), nil),
			want: "spec.spec.devices.config[1].opaque.parameters: " + pluginMessage(t, misspelt),
		},
		"good template": {
			req: request(t, v1Kind("ResourceClaimTemplate"), admissionv1.Create, template(opaque(gpuDriver, goodGPU)), nil),
		},
		"DeviceClass": {
			req:  request(t, v1Kind("DeviceClass"), admissionv1.Create, class(opaque(gpuDriver, misspelt)), nil),
			want: "spec.config[0].opaque.parameters: " + pluginMessage(t, misspelt),
		},
		"DeviceClass updated to a bad config": {
			req:  request(t, v1Kind("DeviceClass"), admissionv1.Update, class(opaque(gpuDriver, badVFIO)), class(opaque(gpuDriver, goodVFIO))),
			want: "spec.config[0].opaque.parameters: " + pluginMessage(t, badVFIO),
		},
		"update that keeps the configs (a finalizer removed)": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Update, claim(opaque(gpuDriver, misspelt)), claim(opaque(gpuDriver, misspelt))),
		},
		"delete": {
			req: request(t, v1Kind("ResourceClaim"), admissionv1.Delete, nil, claim(opaque(gpuDriver, misspelt))),
		},
		"not a resource.k8s.io object": {
			req: request(t, metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, admissionv1.Create, map[string]any{"kind": "Pod"}, nil),
		},
		"ResourceSlice": {
			req: request(t, v1Kind("ResourceSlice"), admissionv1.Create, map[string]any{"kind": "ResourceSlice"}, nil),
		},
		"v1beta2 claim: misregistered": {
			req:  request(t, metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1beta2", Kind: "ResourceClaim"}, admissionv1.Create, claim(opaque(gpuDriver, goodGPU)), nil),
			want: "gpudra's webhook reads ResourceClaim of resource.k8s.io/v1, not v1beta2: register it with matchPolicy: Equivalent and rules for apiVersions [v1]",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := review(t, h, tc.req)
			switch {
			case tc.want == "" && !resp.Allowed:
				t.Errorf("refused: %v", resp.Result)
			case tc.want != "" && resp.Allowed:
				t.Errorf("allowed, want refused with %q", tc.want)
			case tc.want != "" && resp.Result.Message != tc.want:
				t.Errorf("message\n got %s\nwant %s", resp.Result.Message, tc.want)
			}
		})
	}
}

// TestMessageIsThePluginsAtPrepare: the webhook's message for a claim's
// config is, after the path, byte for byte what the plugin reports for
// the same config when it resolves the claim at Prepare.
func TestMessageIsThePluginsAtPrepare(t *testing.T) {
	h := newHandler(t)
	for _, params := range []string{misspelt, wrongKind, badVFIO, notObject,
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":"50"}}}`,
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","strategy":"TimeSlicing"}}`,
		// Once admitted, and refused only by the MPS configurator.
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":0}}}`,
		// Once admitted, and cut to 1 MiB at Prepare.
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"1.5Mi"}}}`,
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"0":"1048576.5"}}}}`,
	} {
		c := claim(opaque(gpuDriver, params))
		resp := h.Admit(context.Background(), request(t, v1Kind("ResourceClaim"), admissionv1.Create, c, nil))
		if resp.Allowed {
			t.Errorf("%s: allowed", params)
			continue
		}
		got, ok := strings.CutPrefix(resp.Result.Message, "spec.devices.config[0].opaque.parameters: ")
		if !ok {
			t.Errorf("%s: message %q does not start with the path", params, resp.Result.Message)
		}
		if causes := resp.Result.Details.Causes; len(causes) != 1 || causes[0].Field != "spec.devices.config[0].opaque.parameters" || causes[0].Message != got {
			t.Errorf("%s: causes %+v", params, causes)
		}

		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: gpuDriver, Pool: "node", Device: "gpu-0"}},
			Config:  []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: c.Spec.Devices.Config[0].DeviceConfiguration}},
		}}
		gpu := func(resourceapi.DeviceRequestAllocationResult) (claimconfig.DeviceKind, error) {
			return claimconfig.GPU, nil
		}
		_, err := claimconfig.Resolve(gpuDriver, c, gpu, claimconfig.ValidationFeatures)
		var ce *claimconfig.ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("%s: Resolve = %v, want a ConfigError", params, err)
		}
		if ce.Err.Error() != got {
			t.Errorf("%s:\nwebhook %s\nplugin  %s", params, got, ce.Err.Error())
		}
	}
}

func TestDriverNames(t *testing.T) {
	h := newHandler(t, WithDriverName(GPUDriver, "gpu.example.com"), WithDriverName(ComputeDomainDriver, ""))
	for _, tc := range []struct {
		driver string
		params string
		want   string
	}{
		{"gpu.example.com", misspelt, "spec.devices.config[0].opaque.parameters: " + pluginMessage(t, misspelt)},
		{gpuDriver, misspelt, ""}, // no longer ours
		{cdDriver, goodGPU, ""},   // turned off
		{"gpu.example.com", goodGPU, ""},
	} {
		resp := h.Admit(context.Background(), request(t, v1Kind("ResourceClaim"), admissionv1.Create, claim(opaque(tc.driver, tc.params)), nil))
		var got string
		if resp.Result != nil {
			got = resp.Result.Message
		}
		if resp.Allowed != (tc.want == "") || (tc.want != "" && got != tc.want) {
			t.Errorf("%s %s: allowed %v, message %q; want %q", tc.driver, tc.params, resp.Allowed, got, tc.want)
		}
	}
	if _, err := NewHandler(WithDriverName(ComputeDomainDriver, gpuDriver)); err == nil {
		t.Error("two drivers of one name accepted")
	}
}

func TestMalformedReview(t *testing.T) {
	h := newHandler(t)
	for name, tc := range map[string]struct {
		method, body string
		want         int
	}{
		"not JSON":           {http.MethodPost, "{", http.StatusBadRequest},
		"no request":         {http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest},
		"v1beta1 review":     {http.MethodPost, `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`, http.StatusBadRequest},
		"another kind":       {http.MethodPost, `{"apiVersion":"v1","kind":"Pod"}`, http.StatusBadRequest},
		"GET":                {http.MethodGet, "", http.StatusMethodNotAllowed},
		"object not decoded": {http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"operation":"CREATE","object":{"spec":"x"}}}`, http.StatusOK},
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, ValidatePath, strings.NewReader(tc.body)))
			if rec.Code != tc.want {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.want, rec.Body)
			}
			if tc.want == http.StatusOK && !strings.Contains(rec.Body.String(), `"allowed":false`) {
				t.Errorf("an object that does not decode was not refused: %s", rec.Body)
			}
		})
	}
}
