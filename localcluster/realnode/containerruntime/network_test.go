package containerruntime_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
)

// TestPodReachesHost checks the pod network carries traffic: a container
// fetches a page the test serves on the host, through the bridge's
// gateway address.
func TestPodReachesHost(t *testing.T) {
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	n := startNode(t, ctx, dir, dir+"/cdi")

	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the host to %s\n", r.RemoteAddr)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	// The bridge plugin gives the bridge the CIDR's first address.
	gw := n.podCIDR.IP.To4()
	gw = net.IPv4(gw[0], gw[1], gw[2], gw[3]+1)
	url := fmt.Sprintf("http://%s:%d/", gw, l.Addr().(*net.TCPAddr).Port)
	out := n.run(t, ctx, "network", &runtimeapi.ContainerConfig{
		Image:   &runtimeapi.ImageSpec{Image: containerruntime.TestImage},
		Command: []string{"/bin/wget", "-q", "-O", "-", url},
	})
	if len(out) != 1 {
		t.Fatalf("container printed %q, want the host's one line", out)
	}
	var got string
	if _, err := fmt.Sscanf(out[0], "hello from the host to %s", &got); err != nil {
		t.Fatalf("container printed %q: %v", out[0], err)
	}
	host, _, err := net.SplitHostPort(got)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !n.podCIDR.Contains(ip) {
		t.Errorf("the request came from %s, want an address in the pod CIDR %s", host, n.podCIDR)
	}
}
