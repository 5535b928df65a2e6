package controlplane

import (
	"net/http"
	"net/http/httptest"
	"testing"

	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// A watch counts as open while it is served, and only then; other verbs
// never do.
func TestOpenWatches(t *testing.T) {
	r := newRequestCounter()
	inside := map[string]RequestCounts{}
	handler := r.wrap(http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
		info, _ := genericapirequest.RequestInfoFrom(req.Context())
		inside[info.Verb] = r.openWatches()
	}))
	serve := func(verb string) {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
		req.Header.Set("User-Agent", "kubelet/node-000")
		req = req.WithContext(genericapirequest.WithRequestInfo(req.Context(), &genericapirequest.RequestInfo{IsResourceRequest: true, Verb: verb, Resource: "pods"}))
		handler.ServeHTTP(httptest.NewRecorder(), req)
	}
	serve("watch")
	serve("list")
	key := RequestKey{Component: "kubelet", Verb: "watch", Resource: "pods"}
	if got := inside["watch"]; len(got) != 1 || got[key] != 1 {
		t.Errorf("open watches while one is served: %v, want %v: 1", got, key)
	}
	if got := inside["list"]; len(got) != 0 {
		t.Errorf("open watches while a list is served after the watch ended: %v, want none", got)
	}
	if got := r.snapshot(); got[key] != 1 || got[RequestKey{Component: "kubelet", Verb: "list", Resource: "pods"}] != 1 {
		t.Errorf("request counts %v, want one watch and one list", got)
	}
}
