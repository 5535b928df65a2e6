package gpudra

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template/parse"

	"go.yaml.in/yaml/v3"
)

// valueRef is a value a template reads: its path under .Values and where.
type valueRef struct {
	path  []string
	where string
}

// dotKind says what a template expression evaluates to, as far as the
// walker follows it.
type dotKind int

const (
	unknown  dotKind = iota // anything else: a list element, a function's result
	rootCtx                 // the chart's top-level context, $ (.Values, .Release)
	valueCtx                // a value under .Values
)

// dot is what the walker knows of an expression's value, or of a block's
// dot; the zero dot is unknown.
type dot struct {
	kind dotKind
	path []string // with valueCtx
}

// templateWalker finds the values the templates read. It follows what Helm
// charts do with values: .Values.a.b from the root context (a file's or a
// define's dot, $, or anything with a Values field, such as the (index . 0)
// of a define called with (list $ ...)), variables set to a value
// ($p := .Values.kubeletPlugin, then $p.driverRoot), and with blocks whose
// dot is a value (with $c.imex, then .daemon). Values reached another way
// (index, dig, a range's elements) it does not see.
type templateWalker struct {
	tree *parse.Tree
	refs []valueRef
}

// list walks a block whose dot is d, with the variables vars.
func (w *templateWalker) list(l *parse.ListNode, d dot, vars map[string]dot) {
	if l == nil {
		return
	}
	// A variable lives until the end of the block that declares it.
	vars = maps.Clone(vars)
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.ActionNode:
			w.pipe(n.Pipe, d, vars)
		case *parse.IfNode:
			inner := maps.Clone(vars)
			w.pipe(n.Pipe, d, inner)
			w.list(n.List, d, inner)
			w.list(n.ElseList, d, inner)
		case *parse.WithNode:
			inner := maps.Clone(vars)
			v := w.pipe(n.Pipe, d, inner)
			w.list(n.List, v, inner)
			w.list(n.ElseList, d, inner)
		case *parse.RangeNode:
			inner := maps.Clone(vars)
			w.pipe(n.Pipe, d, inner)
			for _, v := range n.Pipe.Decl {
				inner[v.Ident[0]] = dot{} // a key or an element
			}
			w.list(n.List, dot{}, inner)
			w.list(n.ElseList, d, inner)
		case *parse.TemplateNode:
			if n.Pipe != nil {
				w.pipe(n.Pipe, d, vars)
			}
		}
	}
}

// pipe records the values a pipeline reads and returns what it evaluates
// to; a pipeline through a function is unknown.
func (w *templateWalker) pipe(p *parse.PipeNode, d dot, vars map[string]dot) dot {
	var v dot
	for _, cmd := range p.Cmds {
		v = w.command(cmd, d, vars)
	}
	if len(p.Cmds) != 1 {
		v = dot{}
	}
	for _, decl := range p.Decl {
		vars[decl.Ident[0]] = v
	}
	return v
}

func (w *templateWalker) command(c *parse.CommandNode, d dot, vars map[string]dot) dot {
	var v dot
	for _, arg := range c.Args {
		v = w.arg(arg, d, vars)
	}
	if len(c.Args) != 1 {
		return dot{}
	}
	return v
}

func (w *templateWalker) arg(n parse.Node, d dot, vars map[string]dot) dot {
	switch n := n.(type) {
	case *parse.FieldNode:
		return w.field(n, d, n.Ident)
	case *parse.VariableNode:
		base, ok := vars[n.Ident[0]]
		if !ok && n.Ident[0] == "$" {
			base = dot{kind: rootCtx}
		}
		return w.field(n, base, n.Ident[1:])
	case *parse.DotNode:
		return w.field(n, d, nil)
	case *parse.ChainNode:
		return w.field(n, w.arg(n.Node, d, vars), n.Field)
	case *parse.PipeNode:
		return w.pipe(n, d, vars)
	}
	return dot{}
}

// field follows fields from base, and records the value it reaches.
func (w *templateWalker) field(n parse.Node, base dot, fields []string) dot {
	var v dot
	switch {
	case base.kind == valueCtx:
		v = dot{kind: valueCtx, path: append(slices.Clone(base.path), fields...)}
	case len(fields) > 0 && fields[0] == "Values":
		v = dot{kind: valueCtx, path: slices.Clone(fields[1:])}
	case len(fields) == 0:
		return base
	default:
		return dot{}
	}
	if len(v.path) > 0 {
		location, _ := w.tree.ErrorContext(n)
		w.refs = append(w.refs, valueRef{path: v.path, where: location})
	}
	return v
}

// templateValueRefs parses every file of templates/, with Helm's and
// sprig's functions left unchecked, and returns the values they read.
func templateValueRefs(t *testing.T) []valueRef {
	t.Helper()
	files, err := filepath.Glob("templates/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates: %v", err)
	}
	trees := map[string]*parse.Tree{}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tree := parse.New(f)
		tree.Mode = parse.SkipFuncCheck
		if _, err := tree.Parse(string(text), "{{", "}}", trees); err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
	}
	var refs []valueRef
	for _, name := range slices.Sorted(maps.Keys(trees)) {
		// A file's dot is the root context, and so is a define's, which
		// every template includes with . or $ (one called with
		// (list $ ...) reaches the values through index . 0, its .Values).
		w := &templateWalker{tree: trees[name]}
		w.list(trees[name].Root, dot{kind: rootCtx}, map[string]dot{"$": {kind: rootCtx}})
		refs = append(refs, w.refs...)
	}
	return refs
}

// defined reports whether values.yaml defines path: each key is in its
// map, or the path goes into a value whose keys are the user's (labels,
// an affinity), which the schema lists no properties of.
func defined(m *yaml.Node, s *schema, path []string) bool {
	for _, key := range path {
		if s != nil && !s.chartDefined() {
			return true
		}
		if m.Kind != yaml.MappingNode {
			return false
		}
		var next *yaml.Node
		for i := 0; i+1 < len(m.Content); i += 2 {
			if m.Content[i].Value == key {
				next = m.Content[i+1]
			}
		}
		if next == nil {
			return false
		}
		m = next
		if s != nil {
			s = s.Properties[key]
		}
	}
	return true
}

// TestTemplatesReadOnlyDefinedValues: every value a template reads is in
// values.yaml. Helm renders a missing value as empty, so a misspelt or
// forgotten key would silently turn a flag or a field off.
func TestTemplatesReadOnlyDefinedValues(t *testing.T) {
	values, s := loadChartValues(t)
	refs := templateValueRefs(t)
	if len(refs) < 100 {
		t.Fatalf("found %d reads of values in templates/; the walker no longer finds them", len(refs))
	}
	reported := map[string]bool{}
	for _, r := range refs {
		p := strings.Join(r.path, ".")
		if !defined(values, s, r.path) && !reported[p] {
			reported[p] = true
			t.Errorf("%s reads .Values.%s, which values.yaml does not define: add it there, with the default the template needs and a comment", r.where, p)
		}
	}
}

// TestTemplatesReadEveryValue: every value of values.yaml is read by a
// template, itself or a key under it, so that none does nothing.
func TestTemplatesReadEveryValue(t *testing.T) {
	values, s := loadChartValues(t)
	refs := templateValueRefs(t)
	read := map[string]bool{}
	for _, r := range refs {
		for i := 1; i <= len(r.path); i++ {
			read[strings.Join(r.path[:i], ".")] = true
		}
	}
	// TestHelmValuesReference reports what is wrong with values.yaml itself.
	all := readSection(func(string, ...any) {}, "", values, s).all()
	if len(all) < 100 {
		t.Fatalf("read %d values from values.yaml; the reader no longer reads them", len(all))
	}
	for _, v := range all {
		if !read[v.path] {
			t.Errorf("values.yaml: %s (line %d) is read by no template: remove it, or read it (through .Values, a variable or a with block; the test does not follow index or dig)", v.path, v.def.Line)
		}
	}
}
