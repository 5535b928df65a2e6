package draplugin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/timeslicing"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

func withDeviceMetadata(c *draplugin.Config) { c.DeviceMetadata = true }

// metadataFile is where the helper writes the metadata of a claim's request
// on the host (its metadataFilePath, which it does not export).
func (h *harness) metadataFile(claim *resourceapi.ResourceClaim, request string) string {
	return filepath.Join(h.cfg.PluginDataDir, "dra-device-metadata", claim.Namespace+"_"+claim.Name, request, "metadata.json")
}

// readMetadata reads a metadata file as a consumer does, with the
// helper's own decoder (the newest version it understands).
func readMetadata(t *testing.T, path string) ([]byte, *metadata.DeviceMetadata) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("metadata file: %v", err)
	}
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &dm); err != nil {
		t.Fatalf("decode metadata %s: %v", data, err)
	}
	return data, &dm
}

func TestDeviceMetadataOfEveryDeviceKind(t *testing.T) {
	str := func(a resourceapi.DeviceAttribute) string {
		if a.StringValue == nil {
			return "<none>"
		}
		return *a.StringValue
	}
	num := func(a resourceapi.DeviceAttribute) string {
		if a.IntValue == nil {
			return "<none>"
		}
		return fmt.Sprint(*a.IntValue)
	}
	type attrs = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	for _, tc := range []struct {
		name   string
		mutate []func(*draplugin.Config)
		mig    bool
		// claim returns the claim and its device's published name.
		claim func(h *harness) (*resourceapi.ResourceClaim, string)
		// want checks what only Prepare knows.
		want func(t *testing.T, h *harness, got attrs)
		// restart prepares again from a new plugin process.
		restart bool
	}{{
		name:    "full GPU",
		restart: true,
		claim:   func(h *harness) (*resourceapi.ResourceClaim, string) { return h.claim("gpu-1"), "gpu-1" },
		want: func(t *testing.T, h *harness, got attrs) {
			if g := str(got["uuid"]); g != h.deviceUUID("gpu-1") {
				t.Errorf("uuid %s, want %s", g, h.deviceUUID("gpu-1"))
			}
			for _, k := range []resourceapi.QualifiedName{"index", "minor", "resource.kubernetes.io/pciBusID", "productName", "driverVersion"} {
				if _, ok := got[k]; !ok {
					t.Errorf("no %s", k)
				}
			}
		},
	}, {
		name:    "dynamic MIG device",
		mig:     true,
		restart: true,
		claim: func(h *harness) (*resourceapi.ResourceClaim, string) {
			name := h.migName(0, "3g.40gb", 4)
			return h.claim(name), name
		},
		want: func(t *testing.T, h *harness, got attrs) {
			migs := h.migDevices(0)
			if len(migs) != 1 {
				t.Fatalf("MIG devices %+v, want one", migs)
			}
			for k, want := range map[resourceapi.QualifiedName]string{
				"uuid": migs[0].UUID, "parentUUID": h.inventory().GPUs[0].UUID, "profile": "3g.40gb", "type": "mig",
			} {
				if g := str(got[k]); g != want {
					t.Errorf("%s %s, want %s", k, g, want)
				}
			}
			for k, want := range map[resourceapi.QualifiedName]string{
				"placementStart": "4", "placementSize": fmt.Sprint(migs[0].PlacementSize),
				"gpuInstanceID": fmt.Sprint(migs[0].GIID), "computeInstanceID": fmt.Sprint(migs[0].CIID),
			} {
				if g := num(got[k]); g != want {
					t.Errorf("%s %s, want %s", k, g, want)
				}
			}
		},
	}, {
		name: "VFIO device",
		mutate: []func(*draplugin.Config){func(c *draplugin.Config) {
			var fake *fakesysfs.Sysfs
			withVFIO(t, devicemodel.VFIOBeside, &fake)(c)
		}},
		claim: func(h *harness) (*resourceapi.ResourceClaim, string) { return h.claim("gpu-vfio-3"), "gpu-vfio-3" },
		want: func(t *testing.T, h *harness, got attrs) {
			if g := num(got["iommuGroup"]); g != "23" {
				t.Errorf("iommuGroup %s, want 23", g)
			}
			if g := str(got["vfioDevicePaths"]); !strings.Contains(g, "/dev/vfio/23") {
				t.Errorf("vfioDevicePaths %q, want the group's node /dev/vfio/23", g)
			}
		},
	}, {
		name: "time-sliced GPU",
		mutate: []func(*draplugin.Config){withUnlimitedSharing(t), func(c *draplugin.Config) {
			c.TimeSlicer = &timeslicing.Memory{}
		}},
		claim: func(h *harness) (*resourceapi.ResourceClaim, string) {
			return h.shareClaim("gpu-7", "share-a", fmt.Sprintf(timeSlicingConfig, "Long")), "gpu-7"
		},
		want: func(t *testing.T, h *harness, got attrs) {
			if g := str(got["timeSliceInterval"]); g != "Long" {
				t.Errorf("timeSliceInterval %s, want Long", g)
			}
			if g := str(got["uuid"]); g != h.deviceUUID("gpu-7") {
				t.Errorf("uuid %s, want %s", g, h.deviceUUID("gpu-7"))
			}
		},
	}, {
		name: "MPS",
		mutate: []func(*draplugin.Config){func(c *draplugin.Config) {
			c.MPS = newMPSManager(t, filepath.Join(shorttemp.Dir(t), "mps"))
		}},
		claim: func(h *harness) (*resourceapi.ResourceClaim, string) {
			c := h.claim("gpu-3")
			withConfig(c, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`)
			return h.update(c), "gpu-3"
		},
		want: func(t *testing.T, h *harness, got attrs) {
			if g := str(got["mpsDaemonID"]); g == "<none>" || g == "" {
				t.Errorf("mpsDaemonID %q, want the claim's daemon", g)
			} else if _, err := os.Stat(h.cfg.MPS.Dirs(g).Root); err != nil {
				t.Errorf("mpsDaemonID %q names no daemon of this node: %v", g, err)
			}
			if g := str(got["mpsPipeDirectory"]); g != "/tmp/nvidia-mps" {
				t.Errorf("mpsPipeDirectory %q", g)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			mutate := append([]func(*draplugin.Config){withDeviceMetadata}, tc.mutate...)
			var h *harness
			if tc.mig {
				h = newMIGHarness(t, mutate...)
			} else {
				h = newHarness(t, mutate...)
			}
			claim, name := tc.claim(h)
			published := h.device(name).Attributes
			resp := h.mustPrepare(claim)

			file := h.metadataFile(claim, "gpu0")
			first, dm := readMetadata(t, file)
			t.Logf("%s:\n%s", file, first)
			if dm.Name != claim.Name || dm.Namespace != claim.Namespace || dm.UID != claim.UID {
				t.Errorf("metadata of claim %s/%s %s, want %s/%s %s", dm.Namespace, dm.Name, dm.UID, claim.Namespace, claim.Name, claim.UID)
			}
			if len(dm.Requests) != 1 || dm.Requests[0].Name != "gpu0" || len(dm.Requests[0].Devices) != 1 {
				t.Fatalf("metadata requests %+v, want gpu0 with one device", dm.Requests)
			}
			dev := dm.Requests[0].Devices[0]
			if dev.Driver != driverName || dev.Pool != h.cfg.NodeName || dev.Name != name {
				t.Errorf("metadata device %s/%s/%s, want %s/%s/%s", dev.Driver, dev.Pool, dev.Name, driverName, h.cfg.NodeName, name)
			}
			// Everything the device is published with, under the same names.
			for k, v := range published {
				if g, ok := dev.Attributes[k]; !ok || !apiequality.Semantic.DeepEqual(g, v) {
					t.Errorf("attribute %s = %+v, want the published %+v", k, g, v)
				}
			}
			tc.want(t, h, dev.Attributes)

			// The helper's CDI device mounts the file where containers
			// look for it.
			metaID := driverName + "/metadata=" + string(claim.UID) + "_gpu0"
			if !slices.Contains(resp.Devices[0].CdiDeviceIds, metaID) {
				t.Fatalf("CDI IDs %v lack the metadata's %s", resp.Devices[0].CdiDeviceIds, metaID)
			}
			spec := ociEdits(t, h.cfg.CDIDir, resp.Devices[0].CdiDeviceIds)
			containerPath := metadata.ResourceClaimFilePath(driverName, claim.Name, "gpu0")
			if !slices.ContainsFunc(spec.Mounts, func(m ocispec.Mount) bool { return m.Source == file && m.Destination == containerPath }) {
				t.Errorf("container mounts %+v lack %s at %s", spec.Mounts, file, containerPath)
			}

			// The kubelet prepares again (a retry, or after its restart):
			// answered from the checkpoint, with the same metadata.
			if tc.restart {
				h.restart()
			}
			h.mustPrepare(claim)
			if again, _ := readMetadata(t, file); !bytes.Equal(again, first) {
				t.Errorf("metadata after a repeated Prepare:\n%s\nwant the first:\n%s", again, first)
			}

			h.mustUnprepare(claim)
			if _, err := os.Stat(filepath.Dir(filepath.Dir(file))); !os.IsNotExist(err) {
				t.Errorf("metadata directory after Unprepare: %v", err)
			}
			for _, f := range h.specFiles() {
				if strings.Contains(f, "_metadata_") {
					t.Errorf("metadata CDI spec %s left after Unprepare", f)
				}
			}
		})
	}
}

// metadataSpec is the helper's CDI spec of a claim's request.
func (h *harness) metadataSpec(claim *resourceapi.ResourceClaim, request string) string {
	return filepath.Join(h.cfg.CDIDir, driverName+"_metadata_"+string(claim.UID)+"_"+request+".json")
}

// TestDeviceMetadataSweep: gpudra's sweep of orphaned CDI specs leaves the
// helper's metadata specs of prepared claims alone, however old, and
// releasing a claim whose ResourceClaim and pods are gone (which the
// kubelet never unprepares) removes its metadata with it.
func TestDeviceMetadataSweep(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	h := newHarness(t, withDeviceMetadata, func(cfg *draplugin.Config) {
		cfg.Clock = func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return now
		}
	})
	claim := h.claim("gpu-2")
	h.mustPrepare(claim)
	file, spec := h.metadataFile(claim, "gpu0"), h.metadataSpec(claim, "gpu0")

	mu.Lock()
	now = now.Add(draplugin.DefaultCallTimeout + time.Hour)
	mu.Unlock()
	h.driver.Sweep(h.ctx)
	h.driver.Sweep(h.ctx)
	for _, p := range []string{file, spec} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("sweep touched the metadata of a prepared claim: %v", err)
		}
	}

	if err := h.client.ResourceV1().ResourceClaims(claim.Namespace).Delete(h.ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.driver.Sweep(h.ctx)
	h.driver.Sweep(h.ctx)
	if strings.Contains(h.checkpoint(), string(claim.UID)) {
		t.Fatalf("the sweep did not release the gone claim:\n%s", h.checkpoint())
	}
	for _, p := range []string{filepath.Dir(filepath.Dir(file)), spec} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after the sweep released its claim: %v", p, err)
		}
	}
}

// TestDeviceMetadataOff: without --device-metadata nothing is written, and
// the files of a claim prepared while it was on still go at Unprepare,
// which the helper no longer does.
func TestDeviceMetadataOff(t *testing.T) {
	h := newHarness(t, withDeviceMetadata)
	before := h.claim("gpu-2")
	h.mustPrepare(before)
	file, spec := h.metadataFile(before, "gpu0"), h.metadataSpec(before, "gpu0")
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}

	h.stop()
	h.cfg.DeviceMetadata = false
	h.start()
	after := h.claim("gpu-3")
	resp := h.mustPrepare(after)
	for _, id := range resp.Devices[0].CdiDeviceIds {
		if strings.Contains(id, "/metadata=") {
			t.Errorf("CDI IDs %v name metadata with --device-metadata=false", resp.Devices[0].CdiDeviceIds)
		}
	}
	if _, err := os.Stat(h.metadataFile(after, "gpu0")); !os.IsNotExist(err) {
		t.Errorf("metadata file with --device-metadata=false: %v", err)
	}

	h.mustUnprepare(before)
	for _, p := range []string{filepath.Dir(filepath.Dir(file)), spec} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s of a claim prepared with metadata, after Unprepare: %v", p, err)
		}
	}
}

// TestComputeDomainDeviceMetadata: a channel claim's metadata names its
// ComputeDomain and the channel the node gave it.
func TestComputeDomainDeviceMetadata(t *testing.T) {
	h := newCDHarnessWith(t, []*v1beta1.ComputeDomain{domain("default", "a", "uid-a", ch(3))}, withDeviceMetadata)
	claim := h.channelClaim("default", "a1", "uid-a")
	resp := h.mustPrepare(claim)
	metaID := cdDriverName + "/metadata=" + string(claim.UID) + "_channel"
	if !slices.Contains(resp.Devices[0].CdiDeviceIds, metaID) {
		t.Errorf("CDI IDs %v lack the metadata's %s", resp.Devices[0].CdiDeviceIds, metaID)
	}
	file := h.metadataFile(claim, "channel")
	_, dm := readMetadata(t, file)
	if len(dm.Requests) != 1 || len(dm.Requests[0].Devices) != 1 {
		t.Fatalf("metadata requests %+v, want one device", dm.Requests)
	}
	got := dm.Requests[0].Devices[0].Attributes
	if a := got["domainID"]; a.StringValue == nil || *a.StringValue != "uid-a" {
		t.Errorf("domainID %+v, want uid-a", a)
	}
	if a := got["channel"]; a.IntValue == nil || *a.IntValue != 3 {
		t.Errorf("channel %+v, want 3", a)
	}
	if a := got["type"]; a.StringValue == nil || *a.StringValue != "channel" {
		t.Errorf("type %+v, want the published channel", a)
	}
	h.mustUnprepare(claim)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("metadata after Unprepare: %v", err)
	}
}
