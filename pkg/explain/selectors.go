package explain

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	celtypes "github.com/google/cel-go/common/types"
	"github.com/google/cel-go/parser"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// clause is one conjunct of a CEL selector: a selector a && b && c has
// three, so that the report can say which of them nothing passes.
type clause struct {
	from string // "class <name>" or "request"
	// selector is the index of the selector the clause is part of.
	selector int
	expr     string // the clause's source text
	compiled cel.CompilationResult
	// cmp is set when the clause compares one attribute (or capacity)
	// with a constant, the shape that lets the report name values and
	// measure how far a device is from passing.
	cmp *comparison
}

// comparison is a clause of the form <attribute> <op> <constant>.
type comparison struct {
	ref attrRef
	op  string // ==, !=, <, <=, >, >=
	// want is the constant: string, int64, bool, float64 or
	// resource.Quantity.
	want any
}

// attrRef is device.attributes[domain].name, device.capacity[domain].name
// or device.driver.
type attrRef struct {
	capacity bool
	driver   bool
	domain   string
	name     string
}

// clauses splits a selector into its top-level && conjuncts and compiles
// each. A selector that does not split (or whose parts do not compile on
// their own) is one clause.
func clauses(cache *cel.Cache, from string, selector int, expr string) []clause {
	p, err := parser.NewParser(parser.EnableOptionalSyntax(true))
	if err != nil {
		return []clause{whole(cache, from, selector, expr)}
	}
	parsed, errs := p.Parse(common.NewTextSource(expr))
	if errs != nil && len(errs.GetErrors()) > 0 {
		return []clause{whole(cache, from, selector, expr)}
	}
	var out []clause
	var split func(e ast.Expr) bool
	split = func(e ast.Expr) bool {
		if e.Kind() == ast.CallKind && e.AsCall().FunctionName() == operators.LogicalAnd {
			for _, arg := range e.AsCall().Args() {
				if !split(arg) {
					return false
				}
			}
			return true
		}
		text, ok := span(expr, parsed.SourceInfo(), e)
		if !ok {
			return false
		}
		c := clause{from: from, selector: selector, expr: text, compiled: cache.GetOrCompile(text), cmp: comparisonOf(e)}
		if c.compiled.Error != nil {
			return false
		}
		out = append(out, c)
		return true
	}
	if !split(parsed.Expr()) {
		return []clause{whole(cache, from, selector, expr)}
	}
	return out
}

func whole(cache *cel.Cache, from string, selector int, expr string) clause {
	return clause{from: from, selector: selector, expr: strings.TrimSpace(expr), compiled: cache.GetOrCompile(expr)}
}

// span returns the source text of a sub-expression: from the first to the
// last offset of its nodes, widened to close the brackets the parser's
// offsets leave open (a call's range ends before its ")").
func span(src string, info *ast.SourceInfo, e ast.Expr) (string, bool) {
	lo, hi := int32(len(src)), int32(-1)
	ast.PostOrderVisit(e, ast.NewExprVisitor(func(x ast.Expr) {
		if r, ok := info.GetOffsetRange(x.ID()); ok {
			lo, hi = min(lo, r.Start), max(hi, r.Stop)
		}
	}))
	if hi < lo || hi > int32(len(src)) {
		return "", false
	}
	end := int(hi)
	// A field selection's range is its dot: take in the field's name.
	if end > 0 && src[end-1] == '.' {
		for end < len(src) && (src[end] == '_' || src[end] == '`' || unicode.IsLetter(rune(src[end])) || unicode.IsDigit(rune(src[end]))) {
			end++
		}
	}
	for open := unclosed(src[lo:end]); open > 0 && end < len(src); end++ {
		switch src[end] {
		case ')', ']':
			open--
		case ' ', '\t', '\n', '\r':
		default:
			return "", false
		}
	}
	text := strings.TrimSpace(src[lo:end])
	if unclosed(text) != 0 {
		return "", false
	}
	return text, true
}

// unclosed counts the brackets the text opens and does not close,
// outside string literals.
func unclosed(s string) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0:
			if ch == '\\' {
				i++
			} else if ch == quote {
				quote = 0
			}
		case ch == '\'' || ch == '"':
			quote = ch
		case ch == '(' || ch == '[':
			depth++
		case ch == ')' || ch == ']':
			depth--
		}
	}
	return depth
}

var flipped = map[string]string{"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

var cmpOps = map[string]string{
	operators.Equals: "==", operators.NotEquals: "!=",
	operators.Less: "<", operators.LessEquals: "<=",
	operators.Greater: ">", operators.GreaterEquals: ">=",
}

// comparisonOf recognizes <attribute> <op> <constant>, either way round,
// and <capacity>.compareTo(quantity("...")) <op> 0.
func comparisonOf(e ast.Expr) *comparison {
	if e.Kind() != ast.CallKind {
		return nil
	}
	call := e.AsCall()
	op, ok := cmpOps[call.FunctionName()]
	if !ok || len(call.Args()) != 2 {
		return nil
	}
	l, r := call.Args()[0], call.Args()[1]
	if ref, ok := refOf(l); ok {
		if want, ok := constantOf(r); ok {
			return &comparison{ref: ref, op: op, want: want}
		}
	}
	if ref, ok := refOf(r); ok {
		if want, ok := constantOf(l); ok {
			return &comparison{ref: ref, op: flipped[op], want: want}
		}
	}
	// x.compareTo(q) <op> 0
	if zero, ok := constantOf(r); ok && zero == int64(0) && l.Kind() == ast.CallKind && l.AsCall().FunctionName() == "compareTo" && l.AsCall().IsMemberFunction() {
		if ref, ok := refOf(l.AsCall().Target()); ok && len(l.AsCall().Args()) == 1 {
			if want, ok := constantOf(l.AsCall().Args()[0]); ok {
				return &comparison{ref: ref, op: op, want: want}
			}
		}
	}
	return nil
}

// refOf recognizes device.driver, device.attributes[D].N,
// device.attributes[D][N] and the same for capacity.
func refOf(e ast.Expr) (attrRef, bool) {
	var base ast.Expr
	var name string
	switch e.Kind() {
	case ast.SelectKind:
		sel := e.AsSelect()
		if sel.IsTestOnly() {
			return attrRef{}, false
		}
		if op := sel.Operand(); op.Kind() == ast.IdentKind && op.AsIdent() == "device" && sel.FieldName() == "driver" {
			return attrRef{driver: true, name: "driver"}, true
		}
		base, name = sel.Operand(), sel.FieldName()
	case ast.CallKind:
		call := e.AsCall()
		if call.FunctionName() != operators.Index || len(call.Args()) != 2 {
			return attrRef{}, false
		}
		n, ok := stringLiteral(call.Args()[1])
		if !ok {
			return attrRef{}, false
		}
		base, name = call.Args()[0], n
	default:
		return attrRef{}, false
	}
	// base must be device.attributes[D] or device.capacity[D].
	if base.Kind() != ast.CallKind || base.AsCall().FunctionName() != operators.Index || len(base.AsCall().Args()) != 2 {
		return attrRef{}, false
	}
	domain, ok := stringLiteral(base.AsCall().Args()[1])
	if !ok {
		return attrRef{}, false
	}
	m := base.AsCall().Args()[0]
	if m.Kind() != ast.SelectKind || m.AsSelect().Operand().Kind() != ast.IdentKind || m.AsSelect().Operand().AsIdent() != "device" {
		return attrRef{}, false
	}
	switch m.AsSelect().FieldName() {
	case "attributes":
		return attrRef{domain: domain, name: name}, true
	case "capacity":
		return attrRef{capacity: true, domain: domain, name: name}, true
	}
	return attrRef{}, false
}

func stringLiteral(e ast.Expr) (string, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(celtypes.String)
	return string(s), ok
}

// constantOf reads a literal, quantity("...") or semver("...").
func constantOf(e ast.Expr) (any, bool) {
	switch e.Kind() {
	case ast.LiteralKind:
		switch v := e.AsLiteral().(type) {
		case celtypes.String:
			return string(v), true
		case celtypes.Int:
			return int64(v), true
		case celtypes.Uint:
			return int64(v), true
		case celtypes.Double:
			return float64(v), true
		case celtypes.Bool:
			return bool(v), true
		}
	case ast.CallKind:
		call := e.AsCall()
		if len(call.Args()) != 1 || call.IsMemberFunction() {
			return nil, false
		}
		s, ok := stringLiteral(call.Args()[0])
		if !ok {
			return nil, false
		}
		switch call.FunctionName() {
		case "quantity":
			q, err := resource.ParseQuantity(s)
			return q, err == nil
		case "semver":
			return s, true
		}
	}
	return nil, false
}

// qualifiedName is how the report names the attribute: without the
// domain when it is the device's driver.
func (r attrRef) qualifiedName(driver string) string {
	if r.driver || r.domain == driver || r.domain == "" {
		return r.name
	}
	return r.domain + "/" + r.name
}

// value returns the device's value of the attribute as text and as a
// comparable value; ok is false when the device has none.
func (r attrRef) value(d *device) (string, any, bool) {
	driver := d.id.Driver.String()
	if r.driver {
		return driver, driver, true
	}
	names := []resourceapi.QualifiedName{resourceapi.QualifiedName(r.domain + "/" + r.name)}
	if r.domain == driver {
		names = append([]resourceapi.QualifiedName{resourceapi.QualifiedName(r.name)}, names...)
	}
	for _, n := range names {
		if r.capacity {
			if c, ok := d.api.Capacity[n]; ok {
				return c.Value.String(), c.Value, true
			}
			continue
		}
		a, ok := d.api.Attributes[n]
		if !ok {
			continue
		}
		text, ok := devicemodel.AttributeText(a)
		if !ok {
			continue
		}
		if a.IntValue != nil {
			return text, *a.IntValue, true
		}
		if a.BoolValue != nil {
			return text, *a.BoolValue, true
		}
		return text, text, true
	}
	return "", nil, false
}

// text is the clause as the report prints it.
func (c *clause) text(driver string) string {
	if c.cmp == nil {
		return c.expr
	}
	var want string
	switch w := c.cmp.want.(type) {
	case string:
		want = fmt.Sprintf("%q", w)
	case resource.Quantity:
		want = w.String()
	default:
		want = fmt.Sprint(w)
	}
	return fmt.Sprintf("%s %s %s", c.cmp.ref.qualifiedName(driver), c.cmp.op, want)
}

// eval evaluates the clause on a device as the allocator evaluates a
// selector.
func (c *clause) eval(ctx context.Context, d *device) (bool, error) {
	ok, _, err := c.compiled.DeviceMatches(ctx, cel.Device{
		Driver:                   d.id.Driver.String(),
		AllowMultipleAllocations: d.api.AllowMultipleAllocations,
		Attributes:               d.api.Attributes,
		Capacity:                 d.api.Capacity,
	})
	if err != nil {
		return false, cel.EnhanceRuntimeError(err)
	}
	return ok, nil
}

// distance is how far the device is from passing a failed clause, from 0
// (a near miss) to 1 (nothing alike).
func (c *clause) distance(d *device) float64 {
	if c.cmp == nil {
		return 1
	}
	_, have, ok := c.cmp.ref.value(d)
	if !ok || c.cmp.op == "!=" {
		return 1
	}
	return valueDistance(have, c.cmp.want)
}
