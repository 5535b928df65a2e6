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
// pod it is reserved for, naming what is wrong, so that `kubectl describe`
// shows it at once: here a MigDeviceConfig written for the claim's only
// request, which got a full GPU (the allocator empties the request list of
// such a config; the claim's spec still has it).
func TestRefusedPrepareIsAnEventOnTheClaimAndItsPod(t *testing.T) {
	h := newHarness(t)
	claim := h.claim("gpu-3")
	const mig = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`
	withConfig(claim, resourceapi.AllocationConfigSourceClaim, nil, mig)
	claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
		Requests:            []string{"gpu0"},
		DeviceConfiguration: claim.Status.Allocation.Devices.Config[0].DeviceConfiguration,
	}}
	claim = h.update(claim)

	msg := prepareError(h, claim)
	for _, want := range []string{"MigDeviceConfig", `"gpu-3"`, "full GPU", "GpuConfig", "claim config #0 (requests [gpu0])"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Prepare error %q does not name %q", msg, want)
		}
	}
	pod := claim.Status.ReservedFor[0]
	want := map[string]bool{"ResourceClaim/" + claim.Name: false, "Pod/" + pod.Name: false}
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
		if want["ResourceClaim/"+claim.Name] && want["Pod/"+pod.Name] {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("events recorded (object: found): %v; want a %s Warning on the claim and on its pod", want, draplugin.ReasonPrepareFailed)
}
