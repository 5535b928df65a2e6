package controlplane

import (
	"context"
	"net"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/server/egressselector"
)

// dialKubelet dials a kubelet's API for kube-apiserver (logs, exec,
// attach, port-forward). A real node's kubelet listens on 127.0.0.1 only
// (its API takes anonymous requests, see realnode/kubelet), but reports
// the machine's own address as the Node's InternalIP, as it refuses a
// loopback node IP: an address of this machine is dialled on 127.0.0.1,
// at the same port. The simulated nodes report 127.0.0.1 already.
func dialKubelet(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	if host, port, err := net.SplitHostPort(address); err == nil && machineAddress(host) {
		address = net.JoinHostPort("127.0.0.1", port)
	}
	return d.DialContext(ctx, network, address)
}

// kubeletLookup is kube-apiserver's kubelet client's dialer.
func kubeletLookup(egressselector.NetworkContext) (utilnet.DialFunc, error) {
	return dialKubelet, nil
}

// machineAddress reports whether host is an IP address of one of this
// machine's network interfaces, loopback excluded.
func machineAddress(host string) bool {
	ip := net.ParseIP(host)
	if ip == nil || ip.IsLoopback() {
		return false
	}
	for _, a := range machineIPs() {
		if a.Equal(ip) {
			return true
		}
	}
	return false
}

// machineIPs are the addresses of this machine's network interfaces,
// loopback excluded: those a real kubelet may report as its node's.
func machineIPs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
			out = append(out, n.IP)
		}
	}
	return out
}
