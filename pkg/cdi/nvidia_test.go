package cdi_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// nvidiaClaimSpec is a per-claim spec as NVIDIA's DRA driver writes it
// (nvcdi's spec, written as YAML under the claim's transient spec name):
// one device per prepared device, named <claim uid>-<device>, with the
// driver's files as common edits.
const nvidiaClaimSpec = `---
cdiVersion: 0.5.0
kind: k8s.gpu.nvidia.com/claim
devices:
- name: nv-claim-gpus-gpu-0
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: nv-claim-gpus-gpu-2-mig-1g12gb-19-0
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia2
    - path: /dev/nvidia-caps/nvidia-cap165
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
`

// TestNVIDIAClaimSpecs: the claims NVIDIA's DRA driver left YAML specs for
// are listed for adoption beside gpudra's own, and read alike; the list of
// gpudra's own specs (which the sweep removes when orphaned) is unchanged.
func TestNVIDIAClaimSpecs(t *testing.T) {
	n := loadNode(t)
	dir := t.TempDir()
	w := newWriter(t, dir)
	for _, uid := range []string{"gpudra-claim", "both"} {
		if err := w.Write(uid, buildSpec(t, n, uid, nil, "gpu-4")); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{
		"k8s.gpu.nvidia.com-claim_nv-claim-gpus.yaml",
		"k8s.gpu.nvidia.com-claim_both.yaml",
		"nvidia.com-gpu.yaml",                 // the container toolkit's spec
		"k8s.gpu.nvidia.com-claim_.yaml",      // no claim UID
		"k8s.gpu.nvidia.com-claim_x.yaml.bak", // not a spec the runtime reads
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(nvidiaClaimSpec), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name string
		list func() ([]string, error)
		want []string
	}{
		{"PreparedClaimUIDs", w.PreparedClaimUIDs, []string{"both", "gpudra-claim", "nv-claim-gpus"}},
		{"ClaimUIDs", w.ClaimUIDs, []string{"both", "gpudra-claim"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.list()
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("%s = %q, %v; want %q", tc.name, got, err, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		uid  string
		want []string
	}{
		{"nv-claim-gpus", []string{"gpu-0", "gpu-2-mig-1g12gb-19-0"}},
		{"both", []string{"gpu-4"}}, // gpudra's spec wins
	} {
		t.Run("Read "+tc.uid, func(t *testing.T) {
			content, err := w.Read(tc.uid)
			if err != nil || !slices.Equal(content.DeviceNames, tc.want) {
				t.Errorf("Read = %+v, %v; want devices %q", content, err, tc.want)
			}
		})
	}
}
