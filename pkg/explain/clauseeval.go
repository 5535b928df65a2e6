package explain

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
)

// failingClauses joins the clauses no candidate passes.
func failingClauses(cs []ClauseReport, first, sep string) string {
	var texts []string
	for _, c := range cs {
		if c.Passed == 0 && c.Error == "" {
			texts = append(texts, c.Text)
		}
	}
	if len(texts) == 0 {
		return ""
	}
	return first + strings.Join(texts, sep)
}

func nearestText(n *NearestDevice) string {
	if n == nil {
		return ""
	}
	where := n.Pool
	if n.Node != "" {
		where = n.Node
	}
	text := fmt.Sprintf("; nearest: %s on %s", n.Device, where)
	if len(n.Differences) > 0 {
		text += " (" + strings.Join(n.Differences, ", ") + ")"
	}
	return text
}

// clauseEval is the outcome of clauses on devices: pass[device][clause],
// and the first runtime error of each clause.
type clauseEval struct {
	clauses []clause
	pass    [][]bool
	errs    []string
	errDev  [][]bool
}

func evalClauses(ctx context.Context, cls []clause, devs []*device) clauseEval {
	e := clauseEval{clauses: cls, pass: make([][]bool, len(devs)), errs: make([]string, len(cls)), errDev: make([][]bool, len(devs))}
	for i, d := range devs {
		e.pass[i], e.errDev[i] = make([]bool, len(cls)), make([]bool, len(cls))
		for j := range cls {
			ok, err := cls[j].eval(ctx, d)
			if err != nil {
				e.errDev[i][j] = true
				if e.errs[j] == "" {
					e.errs[j] = fmt.Sprintf("on %s: %v", d.label(), err)
				}
			}
			e.pass[i][j] = ok
		}
	}
	return e
}

func (e clauseEval) passesAll(i int) bool {
	for _, ok := range e.pass[i] {
		if !ok {
			return false
		}
	}
	return true
}

// fatal names a CEL runtime error the allocator would stop at. It
// evaluates selectors in order and stops at the first false one; a
// selector errs when a clause errs and none of its clauses is false (false
// && error is false in CEL).
func (e clauseEval) fatal(devs []*device) string {
	for i := range devs {
	selectors:
		for j := 0; j < len(e.clauses); {
			k := j
			for k < len(e.clauses) && e.clauses[k].selector == e.clauses[j].selector {
				k++
			}
			erring := -1
			for c := j; c < k; c++ {
				switch {
				case e.errDev[i][c] && erring < 0:
					erring = c
				case !e.errDev[i][c] && !e.pass[i][c]:
					break selectors
				}
			}
			if erring >= 0 {
				return fmt.Sprintf("selector clause %q fails with a CEL runtime error, which stops the scheduler for the whole pod: %s", e.clauses[erring].expr, e.errs[erring])
			}
			j = k
		}
	}
	return ""
}

// clauseReports says of each clause how many candidates pass it, and
// which values of its attribute the candidates have.
func (a *analyzer) clauseReports(ctx context.Context, cands []*device, cls []clause) []ClauseReport {
	e := evalClauses(ctx, cls, cands)
	driver := driverOf(cands)
	var out []ClauseReport
	for j := range cls {
		c := &cls[j]
		r := ClauseReport{From: c.from, Expression: c.expr, Text: c.text(driver), Of: len(cands), Error: e.errs[j]}
		for i := range cands {
			if e.pass[i][j] {
				r.Passed++
			}
		}
		if c.cmp != nil {
			r.Attribute = c.cmp.ref.qualifiedName(driver)
			values := sets.New[string]()
			for _, d := range cands {
				if text, _, ok := c.cmp.ref.value(d); ok {
					values.Insert(text)
				} else {
					values.Insert("(none)")
				}
			}
			r.Values = naturalSorted(values)
		}
		out = append(out, r)
	}
	return out
}

func driverOf(devs []*device) string {
	if len(devs) == 0 {
		return ""
	}
	return devs[0].id.Driver.String()
}

// nearest is the candidate that passes the most clauses; among equals,
// the one whose values differ least from what its failing clauses want,
// then a free one, then the first published.
func (a *analyzer) nearest(ctx context.Context, cands []*device, cls []clause) *NearestDevice {
	if len(cands) == 0 || len(cls) == 0 {
		return nil
	}
	e := evalClauses(ctx, cls, cands)
	type scored struct {
		i      int
		passes int
		dist   float64
	}
	var all []scored
	for i, d := range cands {
		sc := scored{i: i}
		for j := range cls {
			if e.pass[i][j] {
				sc.passes++
			} else {
				sc.dist += cls[j].distance(d)
			}
		}
		all = append(all, sc)
	}
	sort.SliceStable(all, func(x, y int) bool {
		p, q := all[x], all[y]
		if p.passes != q.passes {
			return p.passes > q.passes
		}
		if p.dist != q.dist {
			return p.dist < q.dist
		}
		return cands[p.i].state == stateFree && cands[q.i].state != stateFree
	})
	best := all[0]
	d := cands[best.i]
	n := &NearestDevice{Node: d.node, Pool: d.id.Pool.String(), Device: d.api.Name, Passes: best.passes, Of: len(cls), State: d.state.String()}
	driver := d.id.Driver.String()
	seen := sets.New[string]()
	for j := range cls {
		if e.pass[best.i][j] {
			continue
		}
		n.Failing = append(n.Failing, cls[j].text(driver))
		if cls[j].cmp == nil {
			continue
		}
		name := cls[j].cmp.ref.qualifiedName(driver)
		if seen.Has(name) {
			continue
		}
		seen.Insert(name)
		value, _, ok := cls[j].cmp.ref.value(d)
		if !ok {
			value = "(none)"
		}
		n.Differences = append(n.Differences, name+" "+value)
	}
	return n
}
