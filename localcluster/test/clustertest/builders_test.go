package clustertest

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimconfig"
)

// TestConfig: a typed config comes out as parameters the plugin decodes to
// the same setting; raw parameters pass as written, a mistake included.
func TestConfig(t *testing.T) {
	mps := v1beta1.DefaultGpuConfig()
	mps.Sharing = &v1beta1.GpuSharing{Strategy: v1beta1.MpsStrategy, MpsConfig: &v1beta1.MpsConfig{
		DefaultActiveThreadPercentage: ptr.To(25), DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("20Gi")),
	}}
	c := Config(t, "gpu.nvidia.com", mps, "gpu")
	if c.Opaque == nil || c.Opaque.Driver != "gpu.nvidia.com" || len(c.Requests) != 1 || c.Requests[0] != "gpu" {
		t.Fatalf("config %+v, want gpu.nvidia.com's for request gpu", c)
	}
	decoded, err := claimconfig.DecodeParameters(c.Opaque.Parameters.Raw, claimconfig.ValidationFeatures)
	if err != nil {
		t.Fatalf("the plugin refuses %s: %v", c.Opaque.Parameters.Raw, err)
	}
	got, ok := decoded.(*v1beta1.GpuConfig)
	if !ok || !got.Sharing.IsMps() || *got.Sharing.MpsConfig.DefaultActiveThreadPercentage != 25 {
		t.Errorf("decoded %#v, want the MPS config", decoded)
	}

	misspelt := `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"intervall":"Long"}}}`
	raw := Config(t, "gpu.nvidia.com", json.RawMessage(misspelt))
	if string(raw.Opaque.Parameters.Raw) != misspelt {
		t.Errorf("raw parameters %s, want %s", raw.Opaque.Parameters.Raw, misspelt)
	}
	if _, err := claimconfig.DecodeParameters(raw.Opaque.Parameters.Raw, claimconfig.ValidationFeatures); err == nil || !strings.Contains(err.Error(), "intervall") {
		t.Errorf("the misspelt parameters decode: %v", err)
	}
}

// TestPod: the pod's container uses its one pod claim, made from what
// PodClaim names.
func TestPod(t *testing.T) {
	for _, c := range []PodClaim{{Claim: "shared"}, {Template: "one-gpu"}} {
		p := Pod("ns", "p", c)
		rc := p.Spec.ResourceClaims
		if len(rc) != 1 || len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Resources.Claims[0].Name != rc[0].Name {
			t.Fatalf("%+v: pod %+v does not use its one claim", c, p.Spec)
		}
		if ptr.Deref(rc[0].ResourceClaimName, "") != c.Claim || ptr.Deref(rc[0].ResourceClaimTemplateName, "") != c.Template {
			t.Errorf("%+v: pod claim %+v", c, rc[0])
		}
	}
	tmpl := ClaimTemplate("ns", "t", Spec(Request("dev", "mig.nvidia.com", "a", "b")))
	if r := tmpl.Spec.Spec.Devices.Requests; len(r) != 1 || r[0].Exactly.DeviceClassName != "mig.nvidia.com" || len(r[0].Exactly.Selectors) != 2 || tmpl.Kind != "ResourceClaimTemplate" {
		t.Errorf("template %+v", tmpl)
	}
}
