package checkpoint

import "fmt"

// fileV1 is the schema of the first release. It recorded neither the boot
// nor the device pool, and devices by name only.
type fileV1 struct {
	Version        string              `json:"version"`
	PreparedClaims map[string]*claimV1 `json:"preparedClaims"`
}

type claimV1 struct {
	// Status is "Started" or "Completed".
	Status    string   `json:"status"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Devices   []string `json:"devices"`
}

const (
	statusV1Started   = "Started"
	statusV1Completed = "Completed"
)

// migrateV1 converts a v1 file into v2 (a v5 file without records). The
// result has no boot ID, since v1 did not record one: the loader decides
// from the file's age whether the state belongs to the current boot. Fields
// v1 did not record stay empty: StartedAt zero (unknown), no Consumers, and
// devices without pool, requests, UUIDs or CDI device IDs. A v1 plugin only
// prepared devices of its own node's pool: the reader fills it in
// ([WithPool]).
func migrateV1(f *fileV1) (*fileV5, error) {
	out := &fileV5{Version: versionV2, Claims: make(map[string]*claimV5, len(f.PreparedClaims))}
	for uid, c := range f.PreparedClaims {
		if c == nil {
			return nil, fmt.Errorf("claim %q: null entry", uid)
		}
		var phase string
		switch c.Status {
		case statusV1Started:
			phase = phaseStarted
		case statusV1Completed:
			phase = phaseCompleted
		default:
			return nil, fmt.Errorf("claim %q: unknown status %q (allowed: %s, %s)", uid, c.Status, statusV1Started, statusV1Completed)
		}
		devices := make([]deviceV5, len(c.Devices))
		for i, name := range c.Devices {
			devices[i] = deviceV5{Name: name}
		}
		out.Claims[uid] = &claimV5{
			UID:       uid,
			Namespace: c.Namespace,
			Name:      c.Name,
			Phase:     phase,
			Devices:   devices,
		}
	}
	return out, nil
}
