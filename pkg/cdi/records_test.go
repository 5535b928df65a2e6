package cdi_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
)

func TestSplitDeviceName(t *testing.T) {
	for _, tc := range []struct{ name, device, shareID string }{
		{"gpu-0", "gpu-0", ""},
		{"gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-0", ""},
		{cdi.ShareName("gpu-3", "0b5c1a52-7c1e-4a47-9b0e-3b8e0f1d2c3a"), "gpu-3", "0b5c1a52-7c1e-4a47-9b0e-3b8e0f1d2c3a"},
		{"gpu-3-not-a-uuid", "gpu-3-not-a-uuid", ""},
	} {
		device, shareID := cdi.SplitDeviceName(tc.name)
		if device != tc.device || shareID != tc.shareID {
			t.Errorf("SplitDeviceName(%q) = %q, %q; want %q, %q", tc.name, device, shareID, tc.device, tc.shareID)
		}
	}
}

// TestRecordsRoundTrip writes a spec with records and reads them back, as
// adoption after a lost checkpoint does.
func TestRecordsRoundTrip(t *testing.T) {
	w, err := cdi.NewWriter(t.TempDir(), "gpu.nvidia.com")
	if err != nil {
		t.Fatal(err)
	}
	uid := "11111111-2222-3333-4444-555555555555"
	spec := &cdispec.Spec{
		Kind:    cdi.Kind("gpu.nvidia.com"),
		Devices: []cdispec.Device{{Name: cdi.DeviceName(uid, "gpu-1"), ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=b"}}}},
	}
	records := map[string]json.RawMessage{"vfio": json.RawMessage(`{"devices":[{"device":"gpu-1"}]}`)}
	ids := []cdi.DeviceIdentity{{Name: "gpu-1", UUID: "GPU-1"}}
	if err := cdi.SetClaim(spec, ids, records); err != nil {
		t.Fatal(err)
	}
	if spec.Version == "" {
		t.Fatal("SetRecords left the spec without the version annotations need")
	}
	if err := w.Write(uid, spec); err != nil {
		t.Fatal(err)
	}
	got, err := w.Read(uid)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.DeviceNames) != 1 || got.DeviceNames[0] != "gpu-1" {
		t.Errorf("device names %v, want [gpu-1]", got.DeviceNames)
	}
	if len(got.Devices) != 1 || got.Devices[0] != ids[0] {
		t.Errorf("device identities %+v, want %+v", got.Devices, ids)
	}
	if string(got.Records["vfio"]) != string(records["vfio"]) {
		t.Errorf("records %s, want %s", got.Records, records)
	}
}

// TestReadDamagedSpec: a claim's spec file that holds no spec, or a
// damaged one, is an error for Read, never a panic (adoption reads every
// spec at start, so a panic was a crash loop; found by FuzzRead).
func TestReadDamagedSpec(t *testing.T) {
	w, err := cdi.NewWriter(t.TempDir(), "gpu.nvidia.com")
	if err != nil {
		t.Fatal(err)
	}
	uid := "11111111-2222-3333-4444-555555555555"
	for name, content := range map[string]string{
		"YAML null":        "null",
		"YAML tilde":       "~\n",
		"document marker":  "---\n",
		"empty":            "",
		"truncated":        `{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","devi`,
		"records not JSON": `{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","annotations":{"gpudra.io/records":"{"},"devices":[]}`,
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(w.Path(uid), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Read(uid); err == nil || !strings.Contains(err.Error(), uid) {
				t.Errorf("Read = %v, want an error naming the claim", err)
			}
		})
	}
}
