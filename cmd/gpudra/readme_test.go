package main

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// TestREADMEDocumentsEveryFlag keeps the flag reference in README.md in
// step with the code: every flag of every subcommand is named there, except
// the standard logging flags, which README.md names as a group.
func TestREADMEDocumentsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	logging := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logsapi.AddFlags(logsapi.NewLoggingConfiguration(), logging)
	for _, cmd := range newRootCommand().Commands() {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" || logging.Lookup(f.Name) != nil {
				return
			}
			if !strings.Contains(string(readme), "`--"+f.Name+"`") {
				t.Errorf("README.md does not document %s --%s", cmd.Name(), f.Name)
			}
		})
	}
}

func TestInspectRejectsUnknownFormat(t *testing.T) {
	cmd := newRootCommand()
	cmd.SetArgs([]string{"inspect", "--fleet", "dgx-h100", "-o", "xml"})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "table, yaml, json") {
		t.Errorf("got %v, want an error listing the formats", err)
	}
}

// TestInspectShowsWhatThePluginPublishes: inspect builds with the same
// passthrough and sharing settings as the plugin.
func TestInspectShowsWhatThePluginPublishes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"--node", "dgx-h100-0"}, []string{"gpu-vfio-3", "16 devices"}, nil},
		{[]string{"--node", "dgx-h100-0", "--vfio", "off"}, []string{"8 devices"}, []string{"gpu-vfio-"}},
		{[]string{"--node", "dgx-h100-0", "--vfio", "off", "--sharing", "shares=4", "-o", "yaml"}, []string{"allowMultipleAllocations: true", "shares:"}, []string{"gpu-vfio-"}},
	} {
		var out strings.Builder
		cmd := newRootCommand()
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"inspect", "--fleet", "dgx-h100"}, tc.args...))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("inspect %v: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("inspect %v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
		for _, n := range tc.not {
			if strings.Contains(out.String(), n) {
				t.Errorf("inspect %v: output has %q", tc.args, n)
			}
		}
	}
}
