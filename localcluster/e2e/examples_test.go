package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/localcluster/manifests"
)

// TestExamples applies every example, waits until the pods settle and
// checks each lands on the expected kind of device.
func TestExamples(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	objs, err := manifests.Load(examplesDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := demo.Apply(ctx, objs); err != nil {
		t.Fatal(err)
	}
	if err := demo.WaitSettled(ctx, 2*time.Second); err != nil {
		t.Fatalf("pods did not settle: %v", err)
	}
	report, err := demo.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range report.Pods {
		t.Logf("%s/%s %s on %s: claims %+v containers %+v %s", p.Namespace, p.Name, p.Phase, p.Node, p.Claims, p.Containers, p.Reason)
	}
	pods, err := demo.Client().CoreV1().Pods("single-gpu").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if pod.Status.Phase != corev1.PodRunning {
			t.Errorf("%s: %s", pod.Name, pod.Status.Phase)
		}
		devs, err := demo.AllocatedDevices(ctx, &pod)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range devs {
			if typ := *d.Attributes["type"].StringValue; typ != "gpu" {
				t.Errorf("%s: device %s has type %s", pod.Name, d.Name, typ)
			}
		}
	}
	_ = strings.Contains
}
