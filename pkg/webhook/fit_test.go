package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/claimconfig"
)

// TestFit: a config whose kind cannot fit the device its request's
// DeviceClass selects is refused at admission, where gpudra's classes tell
// the device kind, rather than at Prepare; a request the webhook cannot
// place (a class it does not ship, a firstAvailable alternative the config
// fits) is left to Prepare.
func TestFit(t *testing.T) {
	h := newHandler(t)
	mig := `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig"}`
	gpu := `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`
	forRequests := func(c resourceapi.DeviceConfiguration, requests ...string) resourceapi.DeviceClaimConfiguration {
		return resourceapi.DeviceClaimConfiguration{Requests: requests, DeviceConfiguration: c}
	}
	firstAvailable := func(c *resourceapi.ResourceClaim, name string, classes ...string) *resourceapi.ResourceClaim {
		r := resourceapi.DeviceRequest{Name: name}
		for i, class := range classes {
			r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: string(rune('a' + i)), DeviceClassName: class})
		}
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, r)
		return c
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string // "" for allowed
	}{
		{"MigDeviceConfig for a full GPU, all requests", claim(opaque(gpuDriver, mig)),
			`spec.devices.config[0].opaque.parameters: a MigDeviceConfig configures MIG devices only, and the DeviceClasses of this claim's requests give none; use a GpuConfig`},
		{"MigDeviceConfig naming a full-GPU request", withRequests(&resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Config: []resourceapi.DeviceClaimConfiguration{forRequests(opaque(gpuDriver, mig), "gpu")}}}}, "gpu", "gpu.nvidia.com", "mig", "mig.nvidia.com"),
			`spec.devices.config[0].requests: a MigDeviceConfig cannot configure request "gpu": its DeviceClass gpu.nvidia.com gives a full GPU; use a GpuConfig`},
		{"GpuConfig naming a VFIO request", withRequests(&resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Config: []resourceapi.DeviceClaimConfiguration{forRequests(opaque(gpuDriver, gpu), "vm")}}}}, "vm", "vfio.gpu.nvidia.com"),
			`spec.devices.config[0].requests: a GpuConfig cannot configure request "vm": its DeviceClass vfio.gpu.nvidia.com gives a VFIO passthrough GPU; use a VfioDeviceConfig`},
		{"MigDeviceConfig for a MIG profile class", withRequests(claim(opaque(gpuDriver, mig)), "mig", "mig-3g.40gb.nvidia.com"), ""},
		{"MigDeviceConfig and GpuConfig for all requests of both kinds", withRequests(claim(opaque(gpuDriver, mig), opaque(gpuDriver, gpu)), "gpu", "gpu.nvidia.com", "mig", "mig.nvidia.com"), ""},
		{"a class the webhook does not ship", withRequests(claim(opaque(gpuDriver, mig)), "gpu", "my-gpus.example.com"), ""},
		{"firstAvailable with a MIG alternative", firstAvailable(withRequests(claim()), "any", "gpu.nvidia.com", "mig.nvidia.com"), ""},
		{"firstAvailable of full GPUs only", firstAvailable(withRequests(&resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Config: []resourceapi.DeviceClaimConfiguration{forRequests(opaque(gpuDriver, mig), "any")}}}}), "any", "gpu.nvidia.com", "gpu.nvidia.com"),
			`spec.devices.config[0].requests: a MigDeviceConfig cannot configure request "any": its DeviceClass gpu.nvidia.com gives a full GPU; use a GpuConfig`},
		{"a later GpuConfig for all requests wins", withRequests(&resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Config: []resourceapi.DeviceClaimConfiguration{forRequests(opaque(gpuDriver, mig), "gpu"), forRequests(opaque(gpuDriver, gpu))}}}}, "gpu", "gpu.nvidia.com"), ""},
		{"another driver's config", claim(opaque("other.example.com", mig)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, obj := range []struct {
				kind   string
				object any
				prefix string
			}{
				{"ResourceClaim", tc.claim, ""},
				{"ResourceClaimTemplate", &resourceapi.ResourceClaimTemplate{Spec: resourceapi.ResourceClaimTemplateSpec{Spec: tc.claim.Spec}}, "spec."},
			} {
				resp := h.Admit(context.Background(), request(t, v1Kind(obj.kind), admissionv1.Create, obj.object, nil))
				switch {
				case tc.want == "" && !resp.Allowed:
					t.Errorf("%s refused: %s", obj.kind, resp.Result.Message)
				case tc.want != "" && resp.Allowed:
					t.Errorf("%s allowed, want %s", obj.kind, tc.want)
				case tc.want != "" && resp.Result.Message != obj.prefix+tc.want:
					t.Errorf("%s:\n got %s\nwant %s", obj.kind, resp.Result.Message, obj.prefix+tc.want)
				}
			}
		})
	}
}

// TestFitRefusedAtPrepareToo: what the webhook refuses for a request of
// class gpu.nvidia.com, Resolve refuses for a full GPU allocated for it.
func TestFitRefusedAtPrepareToo(t *testing.T) {
	c := claim(opaque(gpuDriver, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig"}`))
	c.Spec.Devices.Config[0].Requests = []string{"gpu"}
	if resp := newHandler(t).Admit(context.Background(), request(t, v1Kind("ResourceClaim"), admissionv1.Create, c, nil)); resp.Allowed {
		t.Fatal("webhook allowed it")
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: gpuDriver, Pool: "node", Device: "gpu-0"}},
	}}
	_, err := claimconfig.Resolve(gpuDriver, c, func(resourceapi.DeviceRequestAllocationResult) (claimconfig.DeviceKind, error) {
		return claimconfig.GPU, nil
	}, claimconfig.ValidationFeatures)
	var ce *claimconfig.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(ce.Error(), "cannot configure device") {
		t.Errorf("Resolve = %v, want the plugin's refusal", err)
	}
}
