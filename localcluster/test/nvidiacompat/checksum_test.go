// Package nvidiacompat checks gpudra's reading of NVIDIA's DRA driver
// checkpoint against the k8s.io/kubernetes code that driver uses. It lives in
// the localcluster module because the driver module must not depend on
// k8s.io/kubernetes.
package nvidiacompat

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum"

	"github.com/gpudra/gpudra/pkg/checkpoint"
)

// TestKubeletChecksum compares checkpoint.KubeletChecksum with the kubelet
// checkpointmanager's own checksum of the same bytes.
func TestKubeletChecksum(t *testing.T) {
	inputs := [][]byte{{}, []byte(`{"checksum":0}`), []byte(`{"checksum":0,"v1":{"preparedClaims":{}}}`), {0, 255, 10, '"'}}
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "pkg", "checkpoint", "testdata", "nvidia", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no NVIDIA fixtures: %v", err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, data)
	}
	for _, in := range inputs {
		if got, want := checkpoint.KubeletChecksum(in), uint64(checksum.New(in)); got != want {
			t.Errorf("KubeletChecksum(%.40q...) = %d, the kubelet's checksum is %d", in, got, want)
		}
	}
}

// TestFixtureChecksums verifies the committed NVIDIA fixtures with the
// kubelet's checksum package, as NVIDIA's driver verifies them: the
// top-level checksum over {"checksum":0,"v1":...}, the v2 one over the v2
// section with its checksum 0. The damaged fixture must fail.
func TestFixtureChecksums(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "..", "pkg", "checkpoint", "testdata", "nvidia", "*.json"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Checksum checksum.Checksum `json:"checksum"`
			V1       json.RawMessage   `json:"v1,omitempty"`
			V2       json.RawMessage   `json:"v2,omitempty"`
		}
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		view, err := json.Marshal(struct {
			Checksum checksum.Checksum `json:"checksum"`
			V1       json.RawMessage   `json:"v1,omitempty"`
		}{V1: f.V1})
		if err != nil {
			t.Fatal(err)
		}
		ok := f.Checksum.Verify(view) == nil
		if len(f.V2) > 0 {
			var v2 struct {
				Checksum checksum.Checksum `json:"checksum"`
			}
			if err := json.Unmarshal(f.V2, &v2); err != nil {
				t.Fatal(err)
			}
			prefix := []byte(`{"checksum":` + strconv.FormatUint(uint64(v2.Checksum), 10))
			if !bytes.HasPrefix(f.V2, prefix) {
				t.Fatalf("%s: v2 does not start with its checksum", name)
			}
			zeroed := append([]byte(`{"checksum":0`), f.V2[len(prefix):]...)
			ok = ok && v2.Checksum.Verify(zeroed) == nil
		}
		if bad := filepath.Base(name) == "v2-bad-checksum.json"; ok == bad {
			t.Errorf("%s: checksums verify = %v", name, ok)
		}
	}
}
