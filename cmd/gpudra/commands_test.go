package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// commandReference is the page that documents every subcommand's flags.
const commandReference = "../../docs/reference/commands.md"

// TestCommandReferenceDocumentsEveryFlag keeps the command reference in
// step with the code: every flag of every subcommand is named there, except
// the standard logging flags, which the page names as a group.
func TestCommandReferenceDocumentsEveryFlag(t *testing.T) {
	doc, err := os.ReadFile(commandReference)
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
			if !strings.Contains(string(doc), "`--"+f.Name+"`") {
				t.Errorf("%s does not document %s --%s", commandReference, cmd.Name(), f.Name)
			}
		})
	}
}

// TestCommandReferenceMatchesHelp: every flag a table of the command
// reference names exists in that subcommand, and a default the table gives
// as one literal value is the flag's default in --help.
func TestCommandReferenceMatchesHelp(t *testing.T) {
	doc, err := os.ReadFile(commandReference)
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]*pflag.FlagSet{}
	for _, cmd := range newRootCommand().Commands() {
		commands[cmd.Name()] = cmd.Flags()
	}
	flagName := regexp.MustCompile("`(--?[a-z][a-z0-9-]*)`")
	literal := regexp.MustCompile("^`([^`]*)`$")
	var section *pflag.FlagSet
	var sectionName string
	rows := 0
	for _, line := range strings.Split(string(doc), "\n") {
		if name, ok := strings.CutPrefix(line, "## `gpudra "); ok {
			sectionName, _, _ = strings.Cut(name, "`")
			section = commands[sectionName]
			if section == nil {
				t.Errorf("%s has a section for gpudra %s, which is no subcommand", commandReference, sectionName)
			}
			continue
		}
		if strings.HasPrefix(line, "#") {
			// Any other heading ends the section.
			section = nil
			continue
		}
		if section == nil || !strings.HasPrefix(line, "| `-") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			t.Errorf("%s %s row %q: want flag | default | meaning", commandReference, sectionName, line)
			continue
		}
		names := flagName.FindAllStringSubmatch(cells[0], -1)
		def := strings.TrimSpace(cells[1])
		for _, m := range names {
			rows++
			name := strings.TrimLeft(m[1], "-")
			f := section.Lookup(name)
			if f == nil && len(name) == 1 {
				f = section.ShorthandLookup(name)
			}
			if f == nil {
				t.Errorf("%s documents gpudra %s %s, which --help does not list", commandReference, sectionName, m[1])
				continue
			}
			// An empty default in --help is worked out at run time; the
			// table says how.
			v := literal.FindStringSubmatch(def)
			if v == nil || len(names) != 1 || f.DefValue == "" || sameDefault(f, v[1]) {
				continue
			}
			t.Errorf("%s gives gpudra %s %s the default %q, --help %q", commandReference, sectionName, m[1], v[1], f.DefValue)
		}
	}
	if rows < 20 {
		t.Errorf("found %d flags in the tables of %s; the parser no longer reads them", rows, commandReference)
	}
}

// sameDefault reports whether doc names f's default: the same text (a
// list flag's without brackets), or for a duration the same length of time.
func sameDefault(f *pflag.Flag, doc string) bool {
	if doc == f.DefValue || (strings.HasSuffix(f.Value.Type(), "Slice") && "["+doc+"]" == f.DefValue) {
		return true
	}
	if f.Value.Type() != "duration" {
		return false
	}
	a, errA := time.ParseDuration(doc)
	b, errB := time.ParseDuration(f.DefValue)
	return errA == nil && errB == nil && a == b
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

// TestInspectNamesWhatItCouldNotRead: on a fleet whose nodes leave NVML and
// sysfs questions unanswered, inspect lists every GPU and a line for each
// property it published without.
func TestInspectNamesWhatItCouldNotRead(t *testing.T) {
	var out strings.Builder
	cmd := newRootCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"inspect", "--fleet", "vm-quirks", "--vfio", "off"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("inspect: %v", err)
	}
	for _, w := range []string{
		"azure-nd-h100-v5: 8 GPUs, 8 devices",
		"published without pcieRoot: PCIe root of 0008:00:00.0: no PCIe root",
		"dgx-spark: 1 GPUs, 1 devices",
		"published without memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED",
		"published without brand: nvmlDeviceGetBrand: ERROR_NOT_SUPPORTED",
	} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}
