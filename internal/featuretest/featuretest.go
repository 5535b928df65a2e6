// Package featuretest helps the features' tests: seeds for fuzzing a
// configurator's record, taken from the committed example checkpoints as
// the checkpoint package reads them, and the check that a
// record that does not decode is refused as damage.
package featuretest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// exampleBootID is the boot of the committed example checkpoints.
const exampleBootID = "3ee9bf4e-2bc3-4adb-a604-5bd7215f0766"

// knownRecords are the record names of the features whose fuzz tests seed
// from the example checkpoints; a Store reads a file only if it knows
// every record the file holds.
var knownRecords = []string{"migMode", "dynamicMIG", "vfio", "timeSlicing", "mps"}

// testdataDir is pkg/checkpoint/testdata.
func testdataDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("cannot locate the featuretest package")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "pkg", "checkpoint", "testdata")
}

// Seeds returns every record named name in the committed example
// checkpoints (pkg/checkpoint/testdata), read through a checkpoint Store so
// that they come as the plugin reads them (compacted), followed by extra
// and by damaged forms of all of them: cut short, of the wrong JSON type,
// null, empty.
func Seeds(tb testing.TB, name string, extra ...string) [][]byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(testdataDir(tb), "v*.json"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no example checkpoints: %v", err)
	}
	var records [][]byte
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		dir, sys := tb.TempDir(), tb.TempDir()
		if err := os.WriteFile(filepath.Join(dir, checkpoint.FileName), data, 0o600); err != nil {
			tb.Fatal(err)
		}
		bootID := filepath.Join(sys, "boot_id")
		if err := os.WriteFile(bootID, []byte(exampleBootID+"\n"), 0o600); err != nil {
			tb.Fatal(err)
		}
		ctx := klog.NewContext(context.Background(), klog.Logger{}) // discards
		s, _, err := checkpoint.Open(ctx, dir,
			checkpoint.WithBootIDPath(bootID), checkpoint.WithKnownRecords(knownRecords...), checkpoint.WithPool("node-1"))
		if err != nil {
			tb.Fatalf("open %s: %v", file, err)
		}
		st, err := s.Read(ctx)
		_ = s.Close()
		if err != nil {
			tb.Fatalf("read %s: %v", file, err)
		}
		for _, c := range st.Claims {
			if rec := c.Records[name]; rec != nil && !slices.ContainsFunc(records, func(r []byte) bool { return string(r) == string(rec) }) {
				records = append(records, rec)
			}
		}
	}
	for _, e := range extra {
		records = append(records, []byte(e))
	}
	seeds := slices.Clone(records)
	for _, rec := range records {
		seeds = append(seeds, rec[:len(rec)/2])
	}
	return append(seeds, []byte(`[]`), []byte(`"x"`), []byte(`null`), []byte(`{}`), []byte(``))
}

// CheckRefusal fails the test unless err is the refusal of a record that
// does not decode as T: a [preparer.RecordError] naming name. A record that
// decodes may be refused for other reasons, or accepted.
func CheckRefusal[T any](t *testing.T, name, op string, rec []byte, err error) {
	t.Helper()
	if _, decodeErr := (preparer.Codec[T]{Name: name}).Decode(rec); decodeErr == nil {
		return
	}
	var recErr *preparer.RecordError
	if !errors.As(err, &recErr) || recErr.Name != name {
		t.Fatalf("%s of the undecodable record %q = %v, want a RecordError naming %s", op, rec, err, name)
	}
}

// Valid reports whether rec decodes as T, as the configurator's own
// decoding does.
func Valid[T any](name string, rec []byte) bool {
	_, err := (preparer.Codec[T]{Name: name}).Decode(rec)
	return err == nil
}

// Marshal encodes v or fails the test.
func Marshal(tb testing.TB, v any) json.RawMessage {
	tb.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}
