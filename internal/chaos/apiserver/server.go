package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Server is a running API server on a loopback port.
type Server struct {
	store *store
	srv   *http.Server
	ln    net.Listener
	done  chan struct{}
}

// Start serves on a free loopback port until Close.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("API server: %w", err)
	}
	s := &Server{store: newStore(), ln: ln, done: make(chan struct{})}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln) // ends with Close
	}()
	return s, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close stops the server and ends every request, watches included.
func (s *Server) Close() {
	_ = s.srv.Close()
	<-s.done
}

// RESTConfig returns a client config for the server at url (the server's
// own, or a proxy's in front of it).
func RESTConfig(url string) *rest.Config {
	return &rest.Config{Host: url, QPS: -1}
}

// WriteKubeconfig writes a kubeconfig for the server at url to path.
func WriteKubeconfig(path, url string) error {
	const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: chaos
  cluster:
    server: %s
users:
- name: chaos
  user: {}
contexts:
- name: chaos
  context:
    cluster: chaos
    user: chaos
current-context: chaos
`
	return os.WriteFile(path, fmt.Appendf(nil, kubeconfig, url), 0o600)
}

// request is a parsed API path.
type request struct {
	res                  *resource
	namespace, name, sub string
}

// parsePath parses /api/v1/... and /apis/<group>/<version>/... paths.
func parsePath(path string) (request, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	var group, version string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		version, parts = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, version, parts = parts[1], parts[2], parts[3:]
	default:
		return request{}, false
	}
	var r request
	if len(parts) >= 3 && parts[0] == "namespaces" {
		r.namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 || len(parts) > 3 {
		return request{}, false
	}
	r.res = lookupResource(group, version, parts[0])
	if r.res == nil || r.res.namespaced != (r.namespace != "") && !(r.res.namespaced && len(parts) == 1) {
		return request{}, false
	}
	if len(parts) > 1 {
		r.name = parts[1]
	}
	if len(parts) > 2 {
		r.sub = parts[2]
		if r.sub != "status" || !r.res.hasStatus {
			return request{}, false
		}
	}
	return r, true
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, hr *http.Request) {
	r, ok := parsePath(hr.URL.Path)
	if !ok {
		writeError(w, &apiError{code: http.StatusNotFound, reason: "NotFound", message: "the server could not find the requested resource"})
		return
	}
	q := hr.URL.Query()
	var obj object
	var err *apiError
	switch {
	case hr.Method == http.MethodGet && r.name != "":
		obj, err = s.store.get(r.res, r.namespace, r.name)
	case hr.Method == http.MethodGet && (q.Get("watch") == "true" || q.Get("watch") == "1"):
		s.watch(w, hr, r)
		return
	case hr.Method == http.MethodGet:
		obj, err = s.list(r, q.Get("labelSelector"), q.Get("fieldSelector"))
	case hr.Method == http.MethodPost && r.name == "":
		if obj, err = decodeBody(hr); err == nil {
			obj, err = s.store.create(r.res, r.namespace, obj, q.Get("dryRun") == "All")
		}
		if err == nil {
			writeJSON(w, http.StatusCreated, obj)
			return
		}
	case hr.Method == http.MethodPut && r.name != "":
		if obj, err = decodeBody(hr); err == nil {
			obj, err = s.store.update(r.res, r.namespace, r.name, obj, r.sub == "status")
		}
	case hr.Method == http.MethodPatch && r.name != "":
		obj, err = s.patch(hr, r, q.Get("fieldManager"))
	case hr.Method == http.MethodDelete && r.name != "":
		obj, err = s.remove(hr, r)
	default:
		err = unsupported(fmt.Sprintf("%s %s is not supported", hr.Method, hr.URL.Path))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, obj)
}

func writeJSON(w http.ResponseWriter, code int, obj object) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(obj)
}

func writeError(w http.ResponseWriter, err *apiError) { writeJSON(w, err.code, err.status()) }

func decodeBody(hr *http.Request) (object, *apiError) {
	data, err := io.ReadAll(hr.Body)
	if err != nil {
		return nil, badRequest(err.Error())
	}
	switch ct := hr.Header.Get("Content-Type"); {
	case strings.Contains(ct, "yaml"):
		if data, err = yaml.YAMLToJSON(data); err != nil {
			return nil, badRequest(err.Error())
		}
	case strings.HasPrefix(ct, "application/vnd.kubernetes.protobuf"):
		// client-go sends built-in types as protobuf; the store keeps
		// JSON, as the objects' JSON tags render them.
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("decode request body: %v", err))
		}
		if data, err = json.Marshal(obj); err != nil {
			return nil, badRequest(err.Error())
		}
	}
	var obj object
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, badRequest(fmt.Sprintf("decode request body: %v", err))
	}
	return obj, nil
}

func parseSelector(r request, labelSel, fieldSel string) (selector, *apiError) {
	sel := selector{namespace: r.namespace}
	var err error
	if sel.labels, err = labels.Parse(labelSel); err != nil {
		return sel, badRequest(err.Error())
	}
	if sel.fields, err = fields.ParseSelector(fieldSel); err != nil {
		return sel, badRequest(err.Error())
	}
	return sel, nil
}

func (s *Server) list(r request, labelSel, fieldSel string) (object, *apiError) {
	sel, err := parseSelector(r, labelSel, fieldSel)
	if err != nil {
		return nil, err
	}
	items, rv := s.store.list(r.res, sel)
	out := make([]any, len(items))
	for i, o := range items {
		out[i] = o
	}
	return object{
		"kind": r.res.kind + "List", "apiVersion": r.res.apiVersion(),
		"metadata": object{"resourceVersion": strconv.FormatUint(rv, 10)},
		"items":    out,
	}, nil
}

func (s *Server) patch(hr *http.Request, r request, manager string) (object, *apiError) {
	body, err := decodeBody(hr)
	if err != nil {
		return nil, err
	}
	ct := hr.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/apply-patch"):
		if r.res.name != "resourceclaims" || r.sub != "status" {
			return nil, unsupported("server-side apply is served for resourceclaims/status only")
		}
		return s.store.applyStatus(r.res, r.namespace, r.name, manager, body)
	case strings.HasPrefix(ct, "application/merge-patch+json"), strings.HasPrefix(ct, "application/strategic-merge-patch+json"):
		// A strategic merge patch is taken as a merge patch: the objects
		// patched this way (events) have no lists that it would merge.
		for {
			cur, err := s.store.get(r.res, r.namespace, r.name)
			if err != nil {
				return nil, err
			}
			next, _ := mergePatch(cur, body).(map[string]any)
			if r.sub == "status" {
				next = object{"metadata": metadata(cur), "status": next["status"]}
			}
			obj, err := s.store.update(r.res, r.namespace, r.name, next, r.sub == "status")
			if err != nil && err.reason == "Conflict" && str(metadata(body), "resourceVersion") == "" {
				continue // raced with another writer; a patch without a version applies to the latest
			}
			return obj, err
		}
	}
	return nil, &apiError{code: http.StatusUnsupportedMediaType, reason: "UnsupportedMediaType", message: "unsupported patch type " + ct}
}

// mergePatch applies a JSON merge patch (RFC 7386).
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}

func (s *Server) remove(hr *http.Request, r request) (object, *apiError) {
	var opts struct {
		Preconditions *struct {
			UID             *string `json:"uid"`
			ResourceVersion *string `json:"resourceVersion"`
		} `json:"preconditions"`
	}
	if hr.ContentLength != 0 {
		body, aerr := decodeBody(hr)
		if aerr != nil {
			return nil, aerr
		}
		data, _ := json.Marshal(body)
		if err := json.Unmarshal(data, &opts); err != nil {
			return nil, badRequest(fmt.Sprintf("decode delete options: %v", err))
		}
	}
	var uid, rv string
	if p := opts.Preconditions; p != nil {
		if p.UID != nil {
			uid = *p.UID
		}
		if p.ResourceVersion != nil {
			rv = *p.ResourceVersion
		}
	}
	return s.store.remove(r.res, r.namespace, r.name, uid, rv)
}

// initialEventsEnd is the annotation of the bookmark that ends a
// watch-list stream's initial events.
const initialEventsEnd = "k8s.io/initial-events-end"

// watch streams the changes of one resource as the API server does: from
// the given resource version, or from now after synthetic ADDED events
// for what exists (resource version "" or "0", or sendInitialEvents,
// whose initial events end with a bookmark). An object that starts or
// stops matching the selectors is ADDED or DELETED for the watch.
func (s *Server) watch(w http.ResponseWriter, hr *http.Request, r request) {
	q := hr.URL.Query()
	sel, aerr := parseSelector(r, q.Get("labelSelector"), q.Get("fieldSelector"))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ctx := hr.Context()
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(t)*time.Second)
		defer cancel()
	}
	st := s.store
	st.mu.Lock()
	rvParam := q.Get("resourceVersion")
	sendInitial := q.Get("sendInitialEvents") == "true"
	var initial []object
	next := len(st.history)
	if sendInitial || rvParam == "" || rvParam == "0" {
		for _, o := range st.objects[r.res] {
			if sel.matches(o) {
				initial = append(initial, deepCopy(o))
			}
		}
	} else {
		rv, err := strconv.ParseUint(rvParam, 10, 64)
		if err != nil {
			st.mu.Unlock()
			writeError(w, badRequest(fmt.Sprintf("resourceVersion %q: %v", rvParam, err)))
			return
		}
		next = sort.Search(len(st.history), func(i int) bool { return st.history[i].rv > rv })
	}
	bookmarkRV := st.rv
	st.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(typ string, obj object) bool {
		return enc.Encode(object{"type": typ, "object": obj}) == nil
	}
	for _, o := range initial {
		if !send("ADDED", o) {
			return
		}
	}
	if sendInitial {
		bookmark := object{"kind": r.res.kind, "apiVersion": r.res.apiVersion(), "metadata": object{
			"resourceVersion": strconv.FormatUint(bookmarkRV, 10),
			"annotations":     object{initialEventsEnd: "true"},
		}}
		if !send("BOOKMARK", bookmark) {
			return
		}
	}
	for {
		if flusher != nil {
			flusher.Flush()
		}
		st.mu.Lock()
		events := st.history[next:]
		next = len(st.history)
		changed := st.changed
		st.mu.Unlock()
		for _, ev := range events {
			if ev.res != r.res {
				continue
			}
			if typ, ok := watchType(ev, sel); ok && !send(typ, ev.obj) {
				return
			}
		}
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// watchType is how a change looks to a watch with sel: an object that
// comes into view is ADDED, one that leaves it DELETED.
func watchType(ev event, sel selector) (string, bool) {
	now, before := sel.matches(ev.obj), sel.matches(ev.old)
	switch {
	case ev.typ == "MODIFIED" && now && !before:
		return "ADDED", true
	case ev.typ == "MODIFIED" && !now && before:
		return "DELETED", true
	case now:
		return ev.typ, true
	}
	return "", false
}
