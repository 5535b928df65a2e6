package controlplane

import (
	"fmt"
	"net/url"
	"strconv"
	"sync"

	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// serviceRoutes stands in for the Service network (kube-proxy and the
// pods' IPs) where kube-apiserver itself calls a Service: admission
// webhooks, conversion webhooks, aggregated APIs. The local cluster's pods
// run in this process and listen on loopback, which no EndpointSlice may
// name (the API refuses loopback endpoints), so kube-apiserver is given
// this resolver in place of its own: a Service's port resolves to the
// loopback address its pod listens on, as RouteService set it. Everything
// else of the call is as in a cluster: the Service's DNS name as the TLS
// server name, the caBundle of the webhook configuration, the path.
type serviceRoutes struct {
	mu     sync.Mutex
	routes map[string]string
}

func routeKey(namespace, name string, port int32) string {
	return namespace + "/" + name + ":" + strconv.Itoa(int(port))
}

// ResolveEndpoint implements k8s.io/apiserver/pkg/util/webhook.ServiceResolver.
func (r *serviceRoutes) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	addr, ok := r.routes[routeKey(namespace, name, port)]
	if !ok {
		return nil, fmt.Errorf("service %s/%s port %d: no pod of the local cluster serves it", namespace, name, port)
	}
	return &url.URL{Scheme: "https", Host: addr}, nil
}

// resolverMu serializes kube-apiserver configurations: the resolver is
// handed over through a package variable of kube-apiserver's, which is
// read once while the server is configured.
var resolverMu sync.Mutex

// withServiceResolver runs configure (which builds kube-apiserver's
// config) with r as its service resolver.
func withServiceResolver[T any](r *serviceRoutes, configure func() (T, error)) (T, error) {
	resolverMu.Lock()
	defer resolverMu.Unlock()
	restore := app.SetServiceResolverForTests(r)
	defer restore()
	return configure()
}

// RouteService makes kube-apiserver's calls to port of the Service
// namespace/name go to addr (host:port on loopback), where the Service's
// pod listens, until the returned function is called.
func (c *ControlPlane) RouteService(namespace, name string, port int32, addr string) (remove func()) {
	r := c.api.routes
	key := routeKey(namespace, name, port)
	r.mu.Lock()
	r.routes[key] = addr
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.routes[key] == addr {
			delete(r.routes, key)
		}
	}
}
