package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestPeekOnlyReads: Peek returns the claims the plugin would find, and
// leaves the directory exactly as it was, whatever it holds.
func TestPeekOnlyReads(t *testing.T) {
	const claim = `{"version":"v5","bootID":"boot-a","claims":{"uid-1":{"uid":"uid-1","phase":"PrepareCompleted","devices":[{"pool":"node","name":"gpu-0-mig-1g10gb-19-1"}],` +
		`"records":{"dynamicMIG":{"devices":[]}}}}}`
	for _, tc := range []struct {
		name    string
		files   map[string]string
		claims  []string
		wantErr error // nil: no error
		anyErr  bool
	}{
		{name: "no file"},
		{name: "this boot's file", files: map[string]string{FileName: claim}, claims: []string{"uid-1"}},
		{name: "an earlier boot's file", files: map[string]string{FileName: `{"version":"v5","bootID":"boot-old","claims":{"uid-1":{"uid":"uid-1","phase":"PrepareCompleted"}}}`}},
		{name: "unreadable", files: map[string]string{FileName: "garbage"}, anyErr: true},
		{name: "newer", files: map[string]string{FileName: `{"version":"v99","claims":{}}`}, wantErr: ErrNewerVersion},
		{name: "adoption pending", files: map[string]string{FileName: claim, AdoptPendingFileName: "{}"}, wantErr: ErrNeedsAdoption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			for name, content := range tc.files {
				writeFile(t, filepath.Join(e.dir, name), content)
			}
			before := listDir(t, e.dir)
			st, err := Peek(e.dir, e.options()...)
			switch {
			case tc.wantErr != nil || tc.anyErr:
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
					t.Errorf("Peek = %v, want error %v", err, tc.wantErr)
				}
			case err != nil:
				t.Fatalf("Peek: %v", err)
			default:
				var got []string
				for uid := range st.Claims {
					got = append(got, uid)
				}
				slices.Sort(got)
				if !slices.Equal(got, tc.claims) {
					t.Errorf("claims %v, want %v", got, tc.claims)
				}
			}
			if after := listDir(t, e.dir); !slices.Equal(before, after) {
				t.Errorf("Peek changed the directory: %v -> %v", before, after)
			}
		})
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out = append(out, e.Name()+"="+string(data))
	}
	return out
}
