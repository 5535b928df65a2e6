package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/version"
)

func TestVersionCommand(t *testing.T) {
	want := version.Get()
	for _, tc := range []struct {
		args    []string
		check   func(t *testing.T, out string)
		wantErr string
	}{
		{args: nil, check: func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			wantLines := []string{"gpudra " + want.Version, "commit " + want.Commit, "go " + want.GoVersion, "platform " + want.Platform}
			if strings.Join(lines, "\n") != strings.Join(wantLines, "\n") {
				t.Errorf("got\n%s\nwant\n%s", out, strings.Join(wantLines, "\n"))
			}
		}},
		{args: []string{"-o", "json"}, check: func(t *testing.T, out string) {
			var got map[string]string
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			for key, value := range map[string]string{"version": want.Version, "commit": want.Commit, "goVersion": want.GoVersion, "platform": want.Platform} {
				if got[key] != value {
					t.Errorf("%s: got %q, want %q", key, got[key], value)
				}
			}
		}},
		{args: []string{"-o", "yaml"}, wantErr: "want text or json"},
		{args: []string{"extra"}, wantErr: "unknown command"},
	} {
		var out strings.Builder
		cmd := newRootCommand()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"version"}, tc.args...))
		err := cmd.Execute()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("version %v: got error %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("version %v: %v", tc.args, err)
		}
		tc.check(t, out.String())
	}
}
