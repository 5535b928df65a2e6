// Package gpudra holds the Go tests of the Helm chart's own files: that
// docs/reference/helm-values.md is what values.yaml and values.schema.json
// say, and that the templates read exactly the values values.yaml defines.
// The chart's render tests, which need Helm, are in localcluster/install.
// .helmignore keeps these files out of the chart.
package gpudra

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite the generated part of docs/reference/helm-values.md")

const (
	referencePage = "../../../docs/reference/helm-values.md"
	regenerate    = "go test ./deployments/helm/gpudra -update"
	// The generated part of the page lies between these lines; the prose
	// above them is written by hand.
	beginGenerated = "<!-- Generated from values.yaml and values.schema.json by TestHelmValuesReference (" + regenerate + "); edit those, not what follows. -->"
	endGenerated   = "<!-- End of the generated part. -->"
)

// schema is what the reference reads of values.schema.json.
type schema struct {
	Type                 any                `json:"type"` // a name, or a list of names
	Description          string             `json:"description"`
	Enum                 []any              `json:"enum"`
	Pattern              string             `json:"pattern"`
	Minimum              *float64           `json:"minimum"`
	ExclusiveMinimum     *float64           `json:"exclusiveMinimum"`
	Maximum              *float64           `json:"maximum"`
	Properties           map[string]*schema `json:"properties"`
	Items                *schema            `json:"items"`
	AdditionalProperties json.RawMessage    `json:"additionalProperties"`
}

// types lists the JSON types s allows.
func (s *schema) types() []string {
	switch t := s.Type.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, e := range t {
			out = append(out, fmt.Sprint(e))
		}
		return out
	}
	return nil
}

// chartDefined reports whether the chart defines s's keys one by one, so
// that each is a value of its own; any other object (labels, an affinity,
// NVIDIA's config file) is one value whose keys are the user's.
func (s *schema) chartDefined() bool {
	return s != nil && len(s.Properties) > 0
}

// value is one row of the reference: a scalar of values.yaml, or a list or
// user-keyed map as a whole.
type value struct {
	path    string
	def     *yaml.Node
	comment string
	schema  *schema
}

// section is a map of values.yaml whose keys the chart defines, with its
// comment, its values and its own sections, in the order of values.yaml.
type section struct {
	path     string
	comment  string
	values   []value
	sections []*section
}

// all lists the values of sec and of its sections.
func (sec *section) all() []value {
	out := slices.Clone(sec.values)
	for _, sub := range sec.sections {
		out = append(out, sub.all()...)
	}
	return out
}

// loadChartValues reads values.yaml with its comments and
// values.schema.json.
func loadChartValues(t *testing.T) (*yaml.Node, *schema) {
	t.Helper()
	data, err := os.ReadFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatal("values.yaml is not one map")
	}
	data, err = os.ReadFile("values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s schema
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return doc.Content[0], &s
}

// readSection builds the section of map m, whose schema is s, and reports
// to errorf what the page cannot show: a key without a comment to describe
// it, a key that values.yaml or the schema lacks, a default that is not of
// the schema's type or not one of its allowed values.
func readSection(errorf func(format string, args ...any), path string, m *yaml.Node, s *schema) *section {
	sec := &section{path: path}
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, node := m.Content[i], m.Content[i+1]
		p := key.Value
		if path != "" {
			p = path + "." + p
		}
		seen[key.Value] = true
		comment := commentText(key.HeadComment)
		if comment == "" {
			errorf("values.yaml: %s (line %d) has no comment above it; that comment is its description in docs/reference/helm-values.md", p, key.Line)
		}
		ks := s.Properties[key.Value]
		if ks == nil {
			errorf("values.yaml: %s (line %d) is not in values.schema.json, which refuses it at install", p, key.Line)
		} else {
			checkDefault(errorf, p, node, ks)
		}
		if node.Kind == yaml.MappingNode && ks.chartDefined() {
			sub := readSection(errorf, p, node, ks)
			sub.comment = comment
			sec.sections = append(sec.sections, sub)
			continue
		}
		sec.values = append(sec.values, value{path: p, def: node, comment: comment, schema: ks})
	}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		// Helm passes global to every chart; this one has no global values.
		if !seen[name] && (path != "" || name != "global") {
			errorf("values.schema.json allows %s, which values.yaml does not have: add it there, with its default and a comment", strings.TrimPrefix(path+"."+name, "."))
		}
	}
	return sec
}

// commentText is a head comment as one line of prose.
func commentText(head string) string {
	var words []string
	for _, line := range strings.Split(head, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if line != "" {
			words = append(words, line)
		}
	}
	return strings.Join(words, " ")
}

// yamlType is the JSON type of a default as values.yaml writes it.
func yamlType(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "array"
	}
	switch n.ShortTag() {
	case "!!str":
		return "string"
	case "!!int":
		return "integer"
	case "!!float":
		return "number"
	case "!!bool":
		return "boolean"
	case "!!null":
		return "null"
	}
	return n.ShortTag()
}

// checkDefault fails when values.yaml's default for path is not of a type
// s allows, or not one of its allowed values.
func checkDefault(errorf func(format string, args ...any), path string, n *yaml.Node, s *schema) {
	got := yamlType(n)
	types := s.types()
	if len(types) > 0 && !slices.Contains(types, got) && (got != "integer" || !slices.Contains(types, "number")) {
		errorf("values.yaml: %s (line %d) is a %s; values.schema.json wants %s", path, n.Line, got, strings.Join(types, " or "))
	}
	if len(s.Enum) > 0 && n.Kind == yaml.ScalarNode && !slices.ContainsFunc(s.Enum, func(e any) bool { return fmt.Sprint(e) == n.Value }) {
		errorf("values.yaml: %s (line %d) is %q, which values.schema.json does not allow: %v", path, n.Line, n.Value, s.Enum)
	}
	if s.Items != nil && len(s.Items.Enum) > 0 && n.Kind == yaml.SequenceNode {
		for _, item := range n.Content {
			if !slices.ContainsFunc(s.Items.Enum, func(e any) bool { return fmt.Sprint(e) == item.Value }) {
				errorf("values.yaml: %s (line %d) holds %q, which values.schema.json does not allow: %v", path, item.Line, item.Value, s.Items.Enum)
			}
		}
	}
	if s.Pattern != "" && s.Description == "" {
		errorf("values.schema.json: %s has a pattern but no description to say it in words for the reference", path)
	}
}

// TestHelmValuesReference keeps docs/reference/helm-values.md what
// values.yaml and values.schema.json say: every value with its type, its
// allowed values, its default and its comment. values.yaml's comments are
// the one source of the descriptions, so a key without one fails, as does
// a key the schema does not know or a default the schema refuses.
func TestHelmValuesReference(t *testing.T) {
	values, s := loadChartValues(t)
	root := readSection(t.Errorf, "", values, s)
	if n := len(root.all()); n < 100 {
		t.Fatalf("read %d values from values.yaml; the reader no longer reads them", n)
	}
	want := renderReference(root)

	page, err := os.ReadFile(referencePage)
	if err != nil {
		t.Fatal(err)
	}
	head, rest, okBegin := strings.Cut(string(page), beginGenerated+"\n")
	got, tail, okEnd := strings.Cut(rest, endGenerated+"\n")
	if !okBegin || !okEnd {
		t.Fatalf("%s lacks the lines that mark its generated part:\n%s\n%s", referencePage, beginGenerated, endGenerated)
	}
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(referencePage, []byte(head+beginGenerated+"\n"+want+endGenerated+"\n"+tail), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	// Lines are numbered as in the page.
	first := strings.Count(head, "\n") + 2
	t.Errorf("%s is not as generated from values.yaml and values.schema.json; run %s\n(- the page's line, + the generated line):\n%s",
		referencePage, regenerate, lineDiff(got, want, first))
}

// renderReference writes the generated part of the page: the values at the
// top of values.yaml, then a heading, the comment and a table for each of
// its sections.
func renderReference(root *section) string {
	var b strings.Builder
	if len(root.values) > 0 {
		b.WriteString("\n## Top-level values\n\n")
		writeTable(&b, root.values)
	}
	var walk func(sec *section, depth int)
	walk = func(sec *section, depth int) {
		fmt.Fprintf(&b, "\n%s `%s`\n\n%s\n", strings.Repeat("#", min(depth+1, 3)), sec.path, markdown(sec.comment, false))
		if len(sec.values) > 0 {
			b.WriteString("\n")
			writeTable(&b, sec.values)
		}
		for _, sub := range sec.sections {
			walk(sub, depth+1)
		}
	}
	for _, sec := range root.sections {
		walk(sec, 1)
	}
	b.WriteString("\n")
	return b.String()
}

func writeTable(b *strings.Builder, values []value) {
	b.WriteString("| value | type | default | description |\n| --- | --- | --- | --- |\n")
	for _, v := range values {
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", v.path, markdown(typeText(v.schema), true), codeSpan(flowYAML(v.def)), markdown(v.comment, true))
	}
}

// typeText says in words what the schema allows: the type, then its
// description, allowed values and range.
func typeText(s *schema) string {
	if s == nil {
		return ""
	}
	var names []string
	for _, t := range s.types() {
		switch t {
		case "array":
			if s.Items != nil && len(s.Items.types()) == 1 {
				t = "list of " + s.Items.types()[0] + "s"
			} else {
				t = "list"
			}
		case "object":
			var extra schema
			if json.Unmarshal(s.AdditionalProperties, &extra) == nil && len(extra.types()) == 1 {
				t = "map of " + extra.types()[0] + "s"
			}
		}
		names = append(names, t)
	}
	var more []string
	if s.Description != "" {
		more = append(more, s.Description)
	}
	if len(s.Enum) > 0 {
		more = append(more, "one of "+enumText(s.Enum))
	}
	if s.Items != nil && len(s.Items.Enum) > 0 {
		more = append(more, "each one of "+enumText(s.Items.Enum))
	}
	if r := rangeText(s); r != "" {
		more = append(more, r)
	}
	text := strings.Join(names, " or ")
	if len(more) > 0 {
		text += ": " + strings.Join(more, "; ")
	}
	return text
}

func enumText(enum []any) string {
	var out []string
	for _, e := range enum {
		if e == "" {
			out = append(out, "`\"\"`")
			continue
		}
		out = append(out, "`"+fmt.Sprint(e)+"`")
	}
	return strings.Join(out, ", ")
}

// rangeText is a number's bounds in words. A maximum of MaxInt32 is the
// flag's integer type's, not a limit anyone sets, and is left out.
func rangeText(s *schema) string {
	num := func(f *float64) string { return strconv.FormatFloat(*f, 'f', -1, 64) }
	hi := s.Maximum
	if hi != nil && *hi == math.MaxInt32 {
		hi = nil
	}
	switch {
	case s.Minimum != nil && hi != nil:
		return "from " + num(s.Minimum) + " to " + num(hi)
	case s.Minimum != nil:
		return "at least " + num(s.Minimum)
	case s.ExclusiveMinimum != nil:
		return "above " + num(s.ExclusiveMinimum)
	case hi != nil:
		return "at most " + num(hi)
	}
	return ""
}

// flowYAML writes a default on one line as values.yaml gives it: scalars
// as written, with their quotes, maps and lists in flow style.
func flowYAML(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		var pairs []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			pairs = append(pairs, flowYAML(n.Content[i])+": "+flowYAML(n.Content[i+1]))
		}
		return "{" + strings.Join(pairs, ", ") + "}"
	case yaml.SequenceNode:
		var items []string
		for _, item := range n.Content {
			items = append(items, flowYAML(item))
		}
		return "[" + strings.Join(items, ", ") + "]"
	case yaml.AliasNode:
		return flowYAML(n.Alias)
	}
	switch n.Style {
	case yaml.SingleQuotedStyle:
		return "'" + strings.ReplaceAll(n.Value, "'", "''") + "'"
	case yaml.DoubleQuotedStyle, yaml.LiteralStyle, yaml.FoldedStyle:
		return strconv.Quote(n.Value)
	}
	return n.Value
}

func codeSpan(s string) string {
	return "`" + strings.ReplaceAll(s, "|", `\|`) + "`"
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	// docsPath is a page of docs/ named in a comment, which the reference
	// links; the docs link test then fails when the page goes.
	docsPath = regexp.MustCompile(`\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)
	// flagName is a command-line flag named in a comment, which the
	// reference shows as code, as commands.md does.
	flagName = regexp.MustCompile(`(^|[\s(])(--[a-z][a-z0-9-]*)`)
	// mdSpecial are the characters that would make Markdown of a comment:
	// <N> an HTML tag, flags.* the start of emphasis, | a table cell's end.
	mdSpecial = strings.NewReplacer("<", "&lt;", ">", "&gt;", "*", `\*`, "|", `\|`)
)

// markdown turns a comment into Markdown that shows it as written, with
// its flags as code and its docs/ pages linked. Code spans are kept; in a
// table cell their "|" is escaped too.
func markdown(text string, inTable bool) string {
	var b strings.Builder
	last := 0
	plain := func(s string) {
		s = flagName.ReplaceAllString(mdSpecial.Replace(s), "$1`$2`")
		b.WriteString(docsPath.ReplaceAllStringFunc(s, func(p string) string {
			return "[" + p + "](../" + strings.TrimPrefix(p, "docs/") + ")"
		}))
	}
	for _, loc := range inlineCode.FindAllStringIndex(text, -1) {
		plain(text[last:loc[0]])
		code := text[loc[0]:loc[1]]
		if inTable {
			code = strings.ReplaceAll(code, "|", `\|`)
		}
		b.WriteString(code)
		last = loc[1]
	}
	plain(text[last:])
	return b.String()
}

// lineDiff lists the lines that differ between a and b, by a longest
// common subsequence: "-" for a's, "+" for b's, each with its number in a
// counted from first.
func lineDiff(a, b string, first int) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	// lcs[i][j] is the length of the longest common subsequence of x[i:]
	// and y[j:].
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i++
			j++
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, fmt.Sprintf("-%d: %s", first+i, x[i]))
			i++
		default:
			out = append(out, fmt.Sprintf("+%d: %s", first+i, y[j]))
			j++
		}
	}
	const most = 40
	if len(out) > most {
		out = append(out[:most], fmt.Sprintf("... and %d more lines", len(out)-most))
	}
	return strings.Join(out, "\n")
}
