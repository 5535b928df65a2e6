package controlplane

import (
	"net/http"
	"strings"
	"sync"

	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// RequestKey identifies a kind of API request: who made it and what it
// did.
type RequestKey struct {
	// Component is the client's user agent up to its first slash
	// ("kubelet", "gpudra-kubelet-plugin", "localcluster-controller-manager",
	// ...), or "kube-scheduler" for the scheduler's client (whose user
	// agent is client-go's default with "/scheduler" appended).
	Component string
	// Verb is the API verb (get, list, watch, create, update, patch,
	// delete, deletecollection).
	Verb string
	// Resource is the resource, with "/subresource" where there is one.
	Resource string
}

// RequestCounts counts API requests by kind.
type RequestCounts map[RequestKey]int

// Sub returns c minus before: the requests made since before was taken.
func (c RequestCounts) Sub(before RequestCounts) RequestCounts {
	out := RequestCounts{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// requestCounter counts the requests the API server handles; it sits
// inside the handler chain, after authentication and request-info
// resolution, so it sees the verb and resource of every request that
// reached the API.
type requestCounter struct {
	mu     sync.Mutex
	counts RequestCounts
	// open counts the watches being served now, by component and
	// resource (Verb "watch"): what each client holds open, which
	// the cumulative counts cannot tell from re-established watches.
	open RequestCounts
}

func newRequestCounter() *requestCounter {
	return &requestCounter{counts: RequestCounts{}, open: RequestCounts{}}
}

func (r *requestCounter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if info, ok := genericapirequest.RequestInfoFrom(req.Context()); ok && info.IsResourceRequest {
			resource := info.Resource
			if info.Subresource != "" {
				resource += "/" + info.Subresource
			}
			key := RequestKey{Component: component(req.UserAgent()), Verb: info.Verb, Resource: resource}
			r.mu.Lock()
			r.counts[key]++
			if info.Verb == "watch" {
				r.open[key]++
				defer func() {
					r.mu.Lock()
					r.open[key]--
					r.mu.Unlock()
				}()
			}
			r.mu.Unlock()
		}
		next.ServeHTTP(w, req)
	})
}

func (r *requestCounter) snapshot() RequestCounts { return r.copyOf(r.counts) }

func (r *requestCounter) openWatches() RequestCounts { return r.copyOf(r.open) }

func (r *requestCounter) copyOf(counts RequestCounts) RequestCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(RequestCounts, len(counts))
	for k, v := range counts {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// component names the client from its user agent.
func component(userAgent string) string {
	if strings.HasSuffix(userAgent, "/scheduler") {
		return "kube-scheduler"
	}
	name, _, _ := strings.Cut(userAgent, "/")
	if name == "" {
		return "unknown"
	}
	return name
}
