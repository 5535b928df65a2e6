package draplugin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/draplugin"
)

// A refused Prepare is recorded as a Warning event on the claim and on the
// pod or PodGroup (KEP-5729) it is reserved for, naming what is wrong, so
// that `kubectl describe` shows it at once: here a MigDeviceConfig written
// for the claim's only request, which got a full GPU (the allocator
// empties the request list of such a config; the claim's spec still has
// it).
func TestRefusedPrepareIsAnEventOnTheClaimAndItsPod(t *testing.T) {
	for _, tc := range []struct {
		name     string
		consumer *resourceapi.ResourceClaimConsumerReference // nil: the harness's pod
		kind     string
	}{
		{name: "pod", kind: "Pod"},
		{name: "PodGroup", consumer: &resourceapi.ResourceClaimConsumerReference{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg-uid"}, kind: "PodGroup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			claim := h.claim("gpu-3")
			const mig = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`
			withConfig(claim, resourceapi.AllocationConfigSourceClaim, nil, mig)
			claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
				Requests:            []string{"gpu0"},
				DeviceConfiguration: claim.Status.Allocation.Devices.Config[0].DeviceConfiguration,
			}}
			if tc.consumer != nil {
				claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{*tc.consumer}
			}
			claim = h.update(claim)

			msg := prepareError(h, claim)
			for _, want := range []string{"MigDeviceConfig", `"gpu-3"`, "full GPU", "GpuConfig", "claim config #0 (requests [gpu0])"} {
				if !strings.Contains(msg, want) {
					t.Errorf("Prepare error %q does not name %q", msg, want)
				}
			}
			consumer := tc.kind + "/" + claim.Status.ReservedFor[0].Name
			want := map[string]bool{"ResourceClaim/" + claim.Name: false, consumer: false}
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				list, err := h.client.CoreV1().Events(claim.Namespace).List(context.Background(), metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range list.Items {
					if e.Reason != draplugin.ReasonPrepareFailed || e.Type != corev1.EventTypeWarning {
						continue
					}
					key := e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name
					if _, ok := want[key]; ok && strings.Contains(e.Message, "MigDeviceConfig") && e.InvolvedObject.Namespace == claim.Namespace {
						want[key] = true
					}
				}
				if want["ResourceClaim/"+claim.Name] && want[consumer] {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Errorf("events recorded (object: found): %v; want a %s Warning on the claim and on its %s", want, draplugin.ReasonPrepareFailed, tc.kind)
		})
	}
}
