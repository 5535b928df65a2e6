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
