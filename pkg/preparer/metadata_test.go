package preparer_test

import (
	"encoding/json"
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/preparer"
)

// describedWidgets is widgets with device metadata: each device it made
// gets the widgets' count.
type describedWidgets struct{ widgets }

func (*describedWidgets) Metadata(rec *widgetRecord, device string) map[string]resourceapi.DeviceAttribute {
	return map[string]resourceapi.DeviceAttribute{"widgets": {IntValue: ptr.To(int64(len(rec.Widgets)))}, "device": {StringValue: ptr.To(device)}}
}

func TestAdapterMetadata(t *testing.T) {
	rec := json.RawMessage(`{"widgets":["a","b"]}`)
	got, err := preparer.Adapt[widgetRecord](&describedWidgets{}).Metadata(rec, "gpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if w := got["widgets"].IntValue; w == nil || *w != 2 {
		t.Errorf("widgets %v, want 2 from the decoded record", w)
	}
	if d := got["device"].StringValue; d == nil || *d != "gpu-0" {
		t.Errorf("device %v, want gpu-0", d)
	}

	// A feature without metadata adds none, and decodes nothing.
	if got, err := preparer.Adapt[widgetRecord](&widgets{}).Metadata(json.RawMessage(`{`), "gpu-0"); got != nil || err != nil {
		t.Errorf("feature without metadata: %v, %v; want nothing", got, err)
	}

	// A record that does not decode is the checkpoint's damage, said so.
	_, err = preparer.Adapt[widgetRecord](&describedWidgets{}).Metadata(json.RawMessage(`{"widgets":7}`), "gpu-0")
	var recErr *preparer.RecordError
	if !errors.As(err, &recErr) || recErr.Name != "widgets" {
		t.Errorf("damaged record: error %v, want a RecordError of widgets", err)
	}
}
