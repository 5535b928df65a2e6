package cdi_test

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
)

const (
	fuzzDriver = "gpu.nvidia.com"
	fuzzUID    = "11111111-2222-3333-4444-555555555555"
)

// fuzzSpecSeeds are specs as Write writes them (with and without records,
// in JSON and YAML) and damaged ones.
func fuzzSpecSeeds(f *testing.F) [][]byte {
	f.Helper()
	w, err := cdi.NewWriter(f.TempDir(), fuzzDriver)
	if err != nil {
		f.Fatal(err)
	}
	var seeds [][]byte
	for _, records := range []map[string]json.RawMessage{
		nil,
		{"vfio": json.RawMessage(`{"devices":[{"device":"gpu-1","gpu":"0000:1b:00.0","iommuGroup":20,"functions":[{"busID":"0000:1b:00.0","driver":"vfio-pci","originalDriver":"nvidia"}]}]}`)},
		{"dynamicMIG": json.RawMessage(`{"devices":[{"device":"gpu-1-mig-1g10gb-19-0","parentUUID":"GPU-a","profile":"1g.10gb","profileID":19,"start":0,"size":1,"uuid":"MIG-1","giID":7}]}`),
			"mps": json.RawMessage(`{"daemons":[{"id":"` + fuzzUID + `","devices":["gpu-1-mig-1g10gb-19-0"]}]}`)},
	} {
		spec := &cdispec.Spec{
			Kind: cdi.Kind(fuzzDriver),
			Devices: []cdispec.Device{
				{Name: cdi.DeviceName(fuzzUID, "gpu-1"), ContainerEdits: cdispec.ContainerEdits{
					Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
					DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}},
				}},
				{Name: cdi.DeviceName(fuzzUID, cdi.ShareName("gpu-2", "0b5c1a52-7c1e-4a47-9b0e-3b8e0f1d2c3a")), ContainerEdits: cdispec.ContainerEdits{
					DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2}},
				}},
			},
			ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=b"}},
		}
		if err := setVersion(spec, []cdi.DeviceIdentity{{Name: "gpu-1", UUID: "GPU-1"}, {Name: "gpu-2", ShareID: "0b5c1a52-7c1e-4a47-9b0e-3b8e0f1d2c3a", UUID: "GPU-2"}}, records); err != nil {
			f.Fatal(err)
		}
		if err := w.Write(fuzzUID, spec); err != nil {
			f.Fatal(err)
		}
		data, err := os.ReadFile(w.Path(fuzzUID))
		if err != nil {
			f.Fatal(err)
		}
		asYAML, err := yaml.JSONToYAML(data)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, data, asYAML, data[:len(data)/2])
	}
	return append(seeds,
		[]byte(`{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[]}`),
		[]byte(`{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","annotations":{"gpudra.io/records":"{\"vfio\":"},"devices":[{"name":"`+fuzzUID+`-","containerEdits":{}}]}`),
		[]byte(`{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","annotations":{"gpudra.io/records":"null"},"devices":[{"name":"other","containerEdits":{}}]}`),
		[]byte(`{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","annotations":{"gpudra.io/records":"[]"},"devices":null}`),
		[]byte("cdiVersion: 0.6.0\nkind: &a k8s.gpu.nvidia.com/claim\ndevices: *a\n"),
		[]byte(``), []byte(`null`), []byte(`[]`),
	)
}

// FuzzRead puts arbitrary bytes in place as a claim's CDI spec and reads it
// as adoption after a lost checkpoint does. Read never panics and refuses
// with a message; what it accepts names devices of the claim (the claim
// UID prefix cut off, never an empty name) and records that are JSON; and a
// spec written again from what it read (as the preparer writes a missing
// spec again from the records) reads back the same.
func FuzzRead(f *testing.F) {
	for _, seed := range fuzzSpecSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := cdi.NewWriter(t.TempDir(), fuzzDriver)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(w.Path(fuzzUID), data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := w.Read(fuzzUID)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("Read error without a message")
			}
			return
		}
		if uids, err := w.ClaimUIDs(); err != nil || !slices.Equal(uids, []string{fuzzUID}) {
			t.Fatalf("ClaimUIDs = %v, %v; want the claim", uids, err)
		}
		for _, name := range got.DeviceNames {
			if name == "" {
				t.Fatalf("Read returned an empty device name from %q", data)
			}
		}
		for name, rec := range got.Records {
			if !json.Valid(rec) {
				t.Fatalf("record %q is not JSON: %q", name, rec)
			}
		}

		spec := &cdispec.Spec{Kind: cdi.Kind(fuzzDriver)}
		for _, name := range got.DeviceNames {
			spec.Devices = append(spec.Devices, cdispec.Device{
				Name:           cdi.DeviceName(fuzzUID, name),
				ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=b"}},
			})
		}
		if err := setVersion(spec, got.Devices, got.Records); err != nil {
			t.Fatalf("SetClaim of what Read returned: %v", err)
		}
		if err := w.Write(fuzzUID, spec); err != nil {
			return // a device name CDI refuses: the spec cannot be written again, and the claim is prepared anew
		}
		again, err := w.Read(fuzzUID)
		if err != nil {
			t.Fatalf("a spec written from what Read returned does not read: %v", err)
		}
		if !slices.Equal(again.DeviceNames, got.DeviceNames) {
			t.Fatalf("device names %q read back as %q", got.DeviceNames, again.DeviceNames)
		}
		if !slices.Equal(again.Devices, got.Devices) {
			t.Fatalf("device identities %+v read back as %+v", got.Devices, again.Devices)
		}
		if len(got.Records) == 0 != (len(again.Records) == 0) {
			t.Fatalf("records %s read back as %s", got.Records, again.Records)
		}
		for name, rec := range got.Records {
			if back := again.Records[name]; !reflect.DeepEqual(value(t, back), value(t, rec)) {
				t.Fatalf("record %q %s read back as %s", name, rec, back)
			}
		}
	})
}

// setVersion sets the claim's annotations and the version as the preparer
// does.
func setVersion(spec *cdispec.Spec, devices []cdi.DeviceIdentity, records map[string]json.RawMessage) error {
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return err
	}
	spec.Version = v
	return cdi.SetClaim(spec, devices, records)
}

// value is what a record means, whatever its spelling (the annotation is
// written with HTML characters escaped).
func value(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("record %q is not JSON: %v", raw, err)
	}
	return v
}
