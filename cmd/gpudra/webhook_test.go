package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/pkg/webhook"
)

// TestWebhookFlagErrors: a bad command line is refused before anything
// starts, naming the flag.
func TestWebhookFlagErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "tls.crt")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--tls-cert-file and --tls-private-key-file, or --self-signed-dir"},
		{[]string{"--tls-cert-file", missing}, "--tls-private-key-file: give both or neither"},
		{[]string{"--tls-cert-file", missing, "--tls-private-key-file", missing}, "--tls-cert-file: stat " + missing},
		{[]string{"--self-signed-dir", t.TempDir()}, "--self-signed-hosts is required"},
		{[]string{"--self-signed-dir", t.TempDir(), "--self-signed-hosts", "x.svc", "--port", "0"}, "--port 0: must be from 1 to 65535"},
		{[]string{"--self-signed-dir", t.TempDir(), "--self-signed-hosts", "x.svc", "--driver-name", "", "--compute-domain-driver-name", ""}, "nothing to validate"},
		{[]string{"--self-signed-dir", t.TempDir(), "--self-signed-hosts", "x.svc", "--compute-domain-driver-name", "gpu.nvidia.com"}, `--driver-name, --compute-domain-driver-name: drivers`},
	} {
		cmd := newRootCommand()
		cmd.SetArgs(append([]string{"webhook"}, tc.args...))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("webhook %v: error %v, want one with %q", tc.args, err, tc.want)
		}
	}
}

// TestWebhookServes: `gpudra webhook` with a self-signed certificate
// serves its probes and refuses a claim with a misspelt config field.
func TestWebhookServes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// The command's steps but the logging setup, which a process does
	// once and another test may have done.
	cmd, o := webhookCommand()
	if err := cmd.ParseFlags([]string{"--port", port, "--self-signed-dir", dir, "--self-signed-hosts", "127.0.0.1", "--webhook-configuration-name", ""}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- o.serve(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gpudra webhook: %v", err)
		}
	}()

	var client *http.Client
	url := "https://127.0.0.1:" + port
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		ca, err := os.ReadFile(filepath.Join(dir, webhook.SelfSignedCAFile))
		if err != nil {
			return false, nil
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
		resp, err := client.Get(url + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("/readyz never answered: %v", err)
	}

	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1",
		"kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"operation":"CREATE",
		"object":{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","spec":{"devices":{"config":[{"opaque":{"driver":"gpu.nvidia.com",
		"parameters":{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfg":{}}}}}]}}}}}`
	resp, err := client.Post(url+webhook.ValidatePath, "application/json", strings.NewReader(review))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	want := `spec.devices.config[0].opaque.parameters: unknown field "sharing.mpsConfg"`
	if out.Response == nil || out.Response.Allowed || out.Response.UID != "u1" || out.Response.Result.Message != want {
		t.Errorf("response %+v, want a refusal of u1 with %q", out.Response, want)
	}
}
