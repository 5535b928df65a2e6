package draplugin_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The metrics count what the plugin did: Prepares and Unprepares by
// result, the claims prepared now, the devices published by type and the
// checkpoint writes; /readyz answers once the plugin is registered and
// published.
func TestMetricsCountWhatThePluginDid(t *testing.T) {
	h := newHarness(t)
	a, b := h.claim("gpu-0"), h.claim("gpu-1")
	h.mustPrepare(a)
	h.mustPrepare(b)
	if msg := prepareError(h, h.claim("gpu-0")); msg == "" {
		t.Fatal("a second claim for gpu-0 was prepared")
	}
	h.mustUnprepare(a)

	rec := httptest.NewRecorder()
	h.driver.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	text := string(body)
	gpus := 0
	for _, d := range h.driver.Devices() {
		if d.Attributes["type"].StringValue != nil && *d.Attributes["type"].StringValue == "gpu" {
			gpus++
		}
	}
	for _, want := range []string{
		`gpudra_prepare_duration_seconds_count{result="success"} 2`,
		`gpudra_prepare_duration_seconds_count{result="error"} 1`,
		`gpudra_unprepare_duration_seconds_count{result="success"} 1`,
		`gpudra_prepared_claims 1`,
		`gpudra_published_devices{type="gpu"} ` + itoa(gpus),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Which pod uses which GPU: b's GPU, and a's no longer.
	uuidOf := func(device string) string {
		for _, d := range h.driver.Devices() {
			if d.Name == device {
				return *d.Attributes["uuid"].StringValue
			}
		}
		t.Fatalf("no published device %s", device)
		return ""
	}
	info := fmt.Sprintf(`gpudra_prepared_device_info{GPU_I_ID="",UUID="%s",claim="%s",device="gpu-1",mig_uuid="",namespace="default",pod="pod-of-%s",pod_group="",request="gpu0"} 1`, uuidOf("gpu-1"), b.Name, b.Name)
	if !strings.Contains(text, info) || strings.Count(text, "gpudra_prepared_device_info{") != 1 {
		t.Errorf("metrics lack %s, or have more series:\n%s", info, grep(text, "prepared_device_info"))
	}
	if !strings.Contains(text, `gpudra_checkpoint_writes_total{result="success"} `+itoa(int(h.driver.CheckpointWrites()))) || h.driver.CheckpointWrites() < 3 {
		t.Errorf("checkpoint writes: %d; metrics:\n%s", h.driver.CheckpointWrites(), grep(text, "checkpoint"))
	}

	// Not ready until the kubelet registered the plugin, as it does: info,
	// then the registration status.
	if err := h.driver.Ready(); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("Ready before the kubelet registered the plugin: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(h.cfg.RegistrarDir, driverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	reg := registerapi.NewRegistrationClient(conn)
	if _, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.driver.Ready() != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := h.driver.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func grep(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
