package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// ScheduledHealthEvent is one entry of a health events file (gpudra-sim
// --events): what happens to which simulated GPU, and when.
type ScheduledHealthEvent struct {
	// After is the time from the manifests' apply until the event.
	After time.Duration
	// Node is the node's name; GPU the GPU's NVML index on it.
	Node string
	GPU  int
	// Event is what happens (sim.ParseHealthEvent).
	Event sim.HealthEvent
	// Source is "file:line" of the entry.
	Source string
}

// healthEventFields are the fields of an entry, all required.
var healthEventFields = []string{"after", "node", "gpu", "event"}

// LoadHealthEvents reads a health events file: a YAML list of
// {after: <duration>, node: <name>, gpu: <index>, event: xid:<n> |
// ecc-dbe | gpu-lost | recover}. Errors name the file, line, field and
// the values allowed.
func LoadHealthEvents(path string) ([]ScheduledHealthEvent, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseHealthEvents(data, path)
}

// ParseHealthEvents reads the health events of a file's text; source
// names the file in errors.
func ParseHealthEvents(data []byte, source string) ([]ScheduledHealthEvent, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if doc.Kind == 0 {
		return nil, nil // empty file
	}
	list := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		list = doc.Content[0]
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s:%d: must be a list of {after, node, gpu, event}", source, list.Line)
	}
	var out []ScheduledHealthEvent
	var errs []error
	for _, item := range list.Content {
		e, err := parseHealthEvent(item, source)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func parseHealthEvent(item *yaml.Node, source string) (ScheduledHealthEvent, error) {
	e := ScheduledHealthEvent{Source: fmt.Sprintf("%s:%d", source, item.Line)}
	if item.Kind != yaml.MappingNode {
		return e, fmt.Errorf("%s: an entry must be a map with the fields %s", e.Source, strings.Join(healthEventFields, ", "))
	}
	seen := map[string]bool{}
	var errs []error
	for i := 0; i+1 < len(item.Content); i += 2 {
		key, val := item.Content[i], item.Content[i+1]
		at := fmt.Sprintf("%s:%d", source, key.Line)
		if !slices.Contains(healthEventFields, key.Value) {
			errs = append(errs, fmt.Errorf("%s: unknown field %q; the fields are %s", at, key.Value, strings.Join(healthEventFields, ", ")))
			continue
		}
		seen[key.Value] = true
		if val.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("%s: %s: must be a single value", at, key.Value))
			continue
		}
		switch key.Value {
		case "after":
			d, err := time.ParseDuration(val.Value)
			if err != nil || d < 0 {
				errs = append(errs, fmt.Errorf("%s: after: %q is not a duration of zero or more (as in 500ms, 2s, 1m30s)", at, val.Value))
			}
			e.After = d
		case "node":
			if val.Value == "" {
				errs = append(errs, fmt.Errorf("%s: node: must name a node of the fleet", at))
			}
			e.Node = val.Value
		case "gpu":
			n, err := strconv.Atoi(val.Value)
			if err != nil || n < 0 {
				errs = append(errs, fmt.Errorf("%s: gpu: %q is not a GPU index (0, 1, ...: the GPU's NVML index on the node)", at, val.Value))
			}
			e.GPU = n
		case "event":
			ev, err := sim.ParseHealthEvent(val.Value)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: event: %w", at, err))
			}
			e.Event = ev
		}
	}
	for _, f := range healthEventFields {
		if !seen[f] {
			errs = append(errs, fmt.Errorf("%s: missing field %q", e.Source, f))
		}
	}
	return e, errors.Join(errs...)
}

// CheckHealthEvents checks that every event names a node of the fleet
// and one of its GPUs.
func CheckHealthEvents(events []ScheduledHealthEvent, fleet *simfleet.Fleet) error {
	var errs []error
	for _, e := range events {
		n, err := fleet.Node(e.Node)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: node: %q is not in the fleet; its nodes are %s", e.Source, e.Node, strings.Join(fleet.NodeNames(), ", ")))
			continue
		}
		if e.GPU >= len(n.GPUs) {
			errs = append(errs, fmt.Errorf("%s: gpu: node %s has GPUs 0 to %d, not %d", e.Source, e.Node, len(n.GPUs)-1, e.GPU))
		}
	}
	return errors.Join(errs...)
}

// RunHealthEvents injects the events into the nodes' simulated GPUs, each
// at start plus its After, in that order (entries with the same After in
// file order), calling done after each with the injection's error. It
// returns when the last one was injected, or ctx ended.
func (c *Cluster) RunHealthEvents(ctx context.Context, start time.Time, events []ScheduledHealthEvent, done func(ScheduledHealthEvent, error)) error {
	sorted := slices.Clone(events)
	slices.SortStableFunc(sorted, func(a, b ScheduledHealthEvent) int { return int(a.After - b.After) })
	for _, e := range sorted {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(start.Add(e.After))):
		}
		err := c.InjectHealth(e.Node, e.GPU, e.Event)
		if err != nil {
			err = fmt.Errorf("%s: %s on node %s GPU %d: %w", e.Source, e.Event, e.Node, e.GPU, err)
		}
		done(e, err)
	}
	return nil
}
