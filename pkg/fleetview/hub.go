package fleetview

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"
)

// Status is what the page's banners show: whether the API server answers,
// how reading each resource goes, and whether the driver publishes here.
type Status struct {
	Driver string `json:"driver"`
	// APIServer is empty while it answers, else why it does not.
	APIServer string `json:"apiServer,omitempty"`
	// APIServerDownSince is when the API server stopped answering
	// (RFC 3339).
	APIServerDownSince string           `json:"apiServerDownSince,omitempty"`
	Resources          []ResourceStatus `json:"resources"`
	// Slices counts the driver's ResourceSlices.
	Slices int `json:"slices"`
}

// event is one server-sent event.
type event struct {
	name string
	data []byte
}

// subscriberBuffer is how many events a slow page may fall behind before
// it is dropped; it reconnects and starts over from a snapshot.
const subscriberBuffer = 64

// subscriber is one page's event stream.
type subscriber struct{ ch chan event }

// hub keeps the last model as one JSON document per node and hands pages
// the nodes that changed.
type hub struct {
	mu      sync.Mutex
	version uint64
	// nodes holds each node's JSON; names is their sorted names.
	nodes  map[string][]byte
	names  []string
	status []byte
	subs   map[*subscriber]struct{}
}

func newHub() *hub {
	return &hub{nodes: map[string][]byte{}, status: []byte("{}"), subs: map[*subscriber]struct{}{}}
}

// delta is the "delta" event: the nodes that changed or appeared, whole,
// and the names of those that went.
type delta struct {
	Version uint64            `json:"version"`
	Nodes   []json.RawMessage `json:"nodes"`
	Removed []string          `json:"removed"`
}

// publishFleet replaces the model and sends the pages what changed. It
// returns the number of nodes that changed or went.
func (h *hub) publishFleet(f Fleet) (int, error) {
	next := make(map[string][]byte, len(f.Nodes))
	names := make([]string, 0, len(f.Nodes))
	d := delta{Nodes: []json.RawMessage{}, Removed: []string{}}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range f.Nodes {
		data, err := json.Marshal(&f.Nodes[i])
		if err != nil {
			return 0, err
		}
		name := f.Nodes[i].Name
		if old, ok := h.nodes[name]; ok && bytes.Equal(old, data) {
			data = old
		} else {
			d.Nodes = append(d.Nodes, data)
		}
		next[name] = data
		names = append(names, name)
	}
	for _, name := range h.names {
		if _, ok := next[name]; !ok {
			d.Removed = append(d.Removed, name)
		}
	}
	h.nodes, h.names = next, names
	changed := len(d.Nodes) + len(d.Removed)
	if changed == 0 {
		return 0, nil
	}
	h.version++
	d.Version = h.version
	data, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	h.broadcast(event{name: "delta", data: data})
	return changed, nil
}

// publishStatus sends the pages the status when it changed.
func (h *hub) publishStatus(st Status) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if bytes.Equal(data, h.status) {
		return nil
	}
	h.status = data
	h.broadcast(event{name: "status", data: data})
	return nil
}

// broadcast sends ev to every page; h.mu is held.
func (h *hub) broadcast(ev event) {
	for s := range h.subs {
		select {
		case s.ch <- ev:
		default:
			close(s.ch)
			delete(h.subs, s)
		}
	}
}

// snapshotLocked is the "snapshot" document: every node, with the version
// the next delta follows; h.mu is held.
func (h *hub) snapshotLocked() []byte {
	var b bytes.Buffer
	b.WriteString(`{"version":`)
	b.WriteString(strconv.FormatUint(h.version, 10))
	b.WriteString(`,"status":`)
	b.Write(h.status)
	b.WriteString(`,"nodes":[`)
	for i, name := range h.names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(h.nodes[name])
	}
	b.WriteString("]}")
	return b.Bytes()
}

// snapshot returns the snapshot document.
func (h *hub) snapshot() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snapshotLocked()
}

// subscribe returns the snapshot and a subscription that carries every
// event after it.
func (h *hub) subscribe() ([]byte, *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &subscriber{ch: make(chan event, subscriberBuffer)}
	h.subs[s] = struct{}{}
	return h.snapshotLocked(), s
}

// unsubscribe ends a subscription that the hub has not dropped.
func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.ch)
	}
}
