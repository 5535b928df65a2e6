// Package apiserver is a small Kubernetes API server over HTTP for the
// chaos harness: it serves, with the API's own semantics, the few
// resources and verbs gpudra's kubelet plugin uses, to a plugin process
// that reaches it through a kubeconfig.
//
// A real kube-apiserver is not linked by the driver module (ARCHITECTURE:
// the driver must not link an API server, and the local cluster's module,
// which does, takes about ten minutes to build on two cores), and
// client-go's fake clientset lives inside one process. So this package
// serves, from memory:
//
//   - get, list (label and field selectors), watch (from a resource
//     version, with initial events, and watch-list streams that end their
//     initial events with a bookmark), create (generateName included),
//     update (optimistic concurrency on resourceVersion), delete (UID and
//     resourceVersion preconditions) and merge patches;
//   - the status subresource of resources that have one, updated apart
//     from the object as the API server does (create drops status);
//   - server-side apply of a ResourceClaim's status.devices by one field
//     manager at a time, which is all that gpudra applies;
//
// for nodes, pods and events (core/v1) and resourceclaims, resourceslices
// and deviceclasses (resource.k8s.io/v1). There is no validation,
// defaulting, admission or authorization: the plugin's objects are what
// is under test, and the harness checks what it needs to. Errors are
// Status objects with the API server's reasons, so that client-go's
// apierrors predicates work.
package apiserver

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/uuid"
)

// object is one stored object, as decoded JSON.
type object = map[string]any

// resource is one kind of object the server serves.
type resource struct {
	group, version, name, kind string
	namespaced, hasStatus      bool
}

func (r *resource) apiVersion() string {
	if r.group == "" {
		return r.version
	}
	return r.group + "/" + r.version
}

// resources are what the server serves, by group/version/name.
var resources = []*resource{
	{group: "", version: "v1", name: "nodes", kind: "Node", hasStatus: true},
	{group: "", version: "v1", name: "pods", kind: "Pod", namespaced: true, hasStatus: true},
	{group: "", version: "v1", name: "events", kind: "Event", namespaced: true},
	{group: "resource.k8s.io", version: "v1", name: "resourceclaims", kind: "ResourceClaim", namespaced: true, hasStatus: true},
	{group: "resource.k8s.io", version: "v1", name: "resourceslices", kind: "ResourceSlice"},
	{group: "resource.k8s.io", version: "v1", name: "deviceclasses", kind: "DeviceClass"},
}

func lookupResource(group, version, name string) *resource {
	for _, r := range resources {
		if r.group == group && r.version == version && r.name == name {
			return r
		}
	}
	return nil
}

// event is one change, for watches.
type event struct {
	rv       uint64
	res      *resource
	typ      string // ADDED, MODIFIED, DELETED
	obj, old object // old: nil for ADDED
}

// store holds every object and the history of changes. Watches replay
// the history from any resource version: a chaos trial is short, so it is
// never compacted.
type store struct {
	mu      sync.Mutex
	rv      uint64
	objects map[*resource]map[string]object // by "namespace/name"
	history []event
	// changed is closed and replaced whenever history grows.
	changed chan struct{}
	// applied records, per claim key, the status.devices entries each
	// field manager applied (see apply.go).
	applied map[string]map[string][]deviceKey
}

func newStore() *store {
	s := &store{objects: map[*resource]map[string]object{}, changed: make(chan struct{}), applied: map[string]map[string][]deviceKey{}}
	for _, r := range resources {
		s.objects[r] = map[string]object{}
	}
	return s
}

func key(namespace, name string) string { return namespace + "/" + name }

// record appends a change and wakes the watches; the caller holds mu.
func (s *store) record(res *resource, typ string, obj, old object) {
	s.history = append(s.history, event{rv: s.rv, res: res, typ: typ, obj: obj, old: old})
	close(s.changed)
	s.changed = make(chan struct{})
}

// nextRV returns a new resource version; the caller holds mu.
func (s *store) nextRV() string {
	s.rv++
	return strconv.FormatUint(s.rv, 10)
}

// deepCopy copies a JSON object.
func deepCopy(o object) object {
	data, err := json.Marshal(o)
	if err != nil {
		panic(fmt.Sprintf("apiserver: copy object: %v", err)) // decoded JSON always encodes
	}
	var out object
	if err := json.Unmarshal(data, &out); err != nil {
		panic(fmt.Sprintf("apiserver: copy object: %v", err))
	}
	return out
}

func metadata(o object) map[string]any {
	m, _ := o["metadata"].(map[string]any)
	if m == nil {
		m = map[string]any{}
		o["metadata"] = m
	}
	return m
}

func str(m map[string]any, k string) string {
	v, _ := m[k].(string)
	return v
}

// create stores a new object; obj is the decoded request body. With
// dryRun it does all but store it, as a dry-run create does (the kubelet
// plugin probes which ResourceSlice fields the server keeps so).
func (s *store) create(res *resource, namespace string, obj object, dryRun bool) (object, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	md := metadata(obj)
	name := str(md, "name")
	if name == "" {
		prefix := str(md, "generateName")
		if prefix == "" {
			return nil, invalid(res, "", "metadata.name", "name or generateName is required")
		}
		for name == "" || s.objects[res][key(namespace, name)] != nil {
			name = prefix + string(uuid.NewUUID())[:5]
		}
	}
	k := key(namespace, name)
	if _, ok := s.objects[res][k]; ok {
		return nil, alreadyExists(res, name)
	}
	if res.hasStatus {
		delete(obj, "status")
	}
	obj["apiVersion"], obj["kind"] = res.apiVersion(), res.kind
	md["name"] = name
	if res.namespaced {
		md["namespace"] = namespace
	}
	md["uid"] = string(uuid.NewUUID())
	md["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
	md["generation"] = 1
	obj = deepCopy(obj) // numbers as JSON decodes them, like every stored object
	if dryRun {
		return obj, nil
	}
	metadata(obj)["resourceVersion"] = s.nextRV()
	s.objects[res][k] = obj
	s.record(res, "ADDED", deepCopy(obj), nil)
	return deepCopy(obj), nil
}

// get returns a copy of an object.
func (s *store) get(res *resource, namespace, name string) (object, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, ok := s.objects[res][key(namespace, name)]
	if !ok {
		return nil, notFound(res, name)
	}
	return deepCopy(obj), nil
}

// update replaces an object (status false) or its status (status true),
// checking the resource version when the new object names one.
func (s *store) update(res *resource, namespace, name string, obj object, status bool) (object, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(namespace, name)
	cur, ok := s.objects[res][k]
	if !ok {
		return nil, notFound(res, name)
	}
	md, curMD := metadata(obj), metadata(cur)
	if rv := str(md, "resourceVersion"); rv != "" && rv != str(curMD, "resourceVersion") {
		return nil, conflict(res, name, "the object has been modified; please apply your changes to the latest version and try again")
	}
	if uid := str(md, "uid"); uid != "" && uid != str(curMD, "uid") {
		return nil, conflict(res, name, fmt.Sprintf("Precondition failed: UID in precondition: %s, UID in object meta: %s", uid, str(curMD, "uid")))
	}
	next := deepCopy(cur)
	switch {
	case status:
		next["status"] = obj["status"]
	default:
		for f, v := range obj {
			if f != "status" && f != "metadata" {
				next[f] = v
			}
		}
		for f := range next {
			if _, ok := obj[f]; !ok && f != "status" && f != "metadata" && f != "apiVersion" && f != "kind" {
				delete(next, f)
			}
		}
		nmd := metadata(next)
		for _, f := range []string{"labels", "annotations", "finalizers", "ownerReferences"} {
			if v, ok := md[f]; ok {
				nmd[f] = v
			} else {
				delete(nmd, f)
			}
		}
		if st, ok := obj["status"]; ok && !res.hasStatus {
			next["status"] = st
		} else if !res.hasStatus {
			delete(next, "status")
		}
		if g, ok := curMD["generation"].(float64); ok && !jsonEqual(cur["spec"], next["spec"]) {
			nmd["generation"] = g + 1
		}
	}
	return s.replaceLocked(res, k, cur, next), nil
}

// replaceLocked stores next in place of cur with a new resource version;
// the caller holds mu.
func (s *store) replaceLocked(res *resource, k string, cur, next object) object {
	metadata(next)["resourceVersion"] = s.nextRV()
	s.objects[res][k] = next
	s.record(res, "MODIFIED", deepCopy(next), deepCopy(cur))
	return deepCopy(next)
}

func jsonEqual(a, b any) bool {
	da, _ := json.Marshal(a)
	db, _ := json.Marshal(b)
	return string(da) == string(db)
}

// remove deletes an object, checking the UID and resource version
// preconditions when given.
func (s *store) remove(res *resource, namespace, name, uid, rv string) (object, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(namespace, name)
	cur, ok := s.objects[res][k]
	if !ok {
		return nil, notFound(res, name)
	}
	md := metadata(cur)
	if uid != "" && uid != str(md, "uid") {
		return nil, conflict(res, name, fmt.Sprintf("Precondition failed: UID in precondition: %s, UID in object meta: %s", uid, str(md, "uid")))
	}
	if rv != "" && rv != str(md, "resourceVersion") {
		return nil, conflict(res, name, fmt.Sprintf("Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %s", rv, str(md, "resourceVersion")))
	}
	delete(s.objects[res], k)
	delete(s.applied, res.name+"/"+k)
	gone := deepCopy(cur)
	metadata(gone)["resourceVersion"] = s.nextRV()
	s.record(res, "DELETED", deepCopy(gone), nil)
	return gone, nil
}

// selector filters objects by namespace, labels and fields.
type selector struct {
	namespace string // "" for all
	labels    labels.Selector
	fields    fields.Selector
}

func (sel selector) matches(o object) bool {
	if o == nil {
		return false
	}
	md := metadata(o)
	if sel.namespace != "" && str(md, "namespace") != sel.namespace {
		return false
	}
	if sel.labels != nil && !sel.labels.Empty() {
		set := labels.Set{}
		if l, ok := md["labels"].(map[string]any); ok {
			for k, v := range l {
				set[k], _ = v.(string)
			}
		}
		if !sel.labels.Matches(set) {
			return false
		}
	}
	if sel.fields != nil && !sel.fields.Empty() {
		set := fields.Set{}
		for _, r := range sel.fields.Requirements() {
			set[r.Field] = fieldValue(o, r.Field)
		}
		if !sel.fields.Matches(set) {
			return false
		}
	}
	return true
}

// fieldValue returns the value at a dotted path such as spec.pool.name,
// as a field selector compares it; "" when absent.
func fieldValue(o object, path string) string {
	var cur any = o
	start := 0
	for i := 0; i <= len(path); i++ {
		if i < len(path) && path[i] != '.' {
			continue
		}
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[path[start:i]]
		start = i + 1
	}
	switch v := cur.(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// list returns the matching objects, sorted by key, and the current
// resource version.
func (s *store) list(res *resource, sel selector) ([]object, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []object
	for _, k := range slices.Sorted(maps.Keys(s.objects[res])) {
		if o := s.objects[res][k]; sel.matches(o) {
			out = append(out, deepCopy(o))
		}
	}
	return out, s.rv
}
