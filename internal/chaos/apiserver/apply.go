package apiserver

import (
	"slices"
)

// deviceKey identifies an entry of a claim's status.devices, as the
// entries' list-map keys do (driver, pool, device, shareID).
type deviceKey struct{ driver, pool, device, shareID string }

func keyOf(entry any) deviceKey {
	m, _ := entry.(map[string]any)
	return deviceKey{str(m, "driver"), str(m, "pool"), str(m, "device"), str(m, "shareID")}
}

// applyStatus is server-side apply of a ResourceClaim's status by one
// field manager, for the one field gpudra applies: status.devices, a list
// map. The manager's entries become exactly those it applies; entries
// other managers applied stay. Applying no devices gives up all of the
// manager's entries. Anything else in the applied status is ignored.
// With force, as gpudra applies, there are no conflicts to report.
func (s *store) applyStatus(res *resource, namespace, name, manager string, applied object) (object, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(namespace, name)
	cur, ok := s.objects[res][k]
	if !ok {
		return nil, notFound(res, name)
	}
	if uid := str(metadata(applied), "uid"); uid != "" && uid != str(metadata(cur), "uid") {
		return nil, invalid(res, name, "metadata.uid", "field is immutable")
	}
	var entries []any
	if st, ok := applied["status"].(map[string]any); ok {
		entries, _ = st["devices"].([]any)
	}
	owned := s.applied[res.name+"/"+k]
	if owned == nil {
		owned = map[string][]deviceKey{}
		s.applied[res.name+"/"+k] = owned
	}
	next := deepCopy(cur)
	status, _ := next["status"].(map[string]any)
	if status == nil {
		status = map[string]any{}
		next["status"] = status
	}
	existing, _ := status["devices"].([]any)
	var keep []any
	for _, e := range existing {
		if !slices.Contains(owned[manager], keyOf(e)) && !slices.ContainsFunc(entries, func(n any) bool { return keyOf(n) == keyOf(e) }) {
			keep = append(keep, e)
		}
	}
	var mine []deviceKey
	for _, e := range entries {
		mine = append(mine, keyOf(e))
	}
	owned[manager] = mine
	devices := append(keep, entries...)
	if len(devices) == 0 {
		delete(status, "devices")
	} else {
		status["devices"] = devices
	}
	if jsonEqual(cur, next) {
		return deepCopy(cur), nil
	}
	return s.replaceLocked(res, k, cur, next), nil
}
