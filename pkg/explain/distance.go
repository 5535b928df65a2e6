package explain

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
)

// valueDistance is how far a device's value is from the value a clause
// wants, from 0 to 1. Names that differ only in their numbers (MIG
// profiles: 1g.10gb and 1g.20gb, product names: A100 and H100) are nearer
// than names that differ in their words, and among them the smaller the
// relative difference of the numbers, the nearer.
func valueDistance(have, want any) float64 {
	switch w := want.(type) {
	case string:
		h, ok := have.(string)
		if !ok {
			return 1
		}
		return stringDistance(h, w)
	case int64:
		if h, ok := have.(int64); ok {
			return relative(float64(h), float64(w))
		}
	case float64:
		if h, ok := have.(int64); ok {
			return relative(float64(h), w)
		}
	case resource.Quantity:
		if h, ok := have.(resource.Quantity); ok {
			return relative(h.AsApproximateFloat64(), w.AsApproximateFloat64())
		}
	}
	return 1
}

// relative is |a-b| / max(|a|,|b|), in [0,1].
func relative(a, b float64) float64 {
	m := math.Max(math.Abs(a), math.Abs(b))
	if m == 0 {
		return 0
	}
	return math.Min(1, math.Abs(a-b)/m)
}

// stringDistance: strings of the same shape (the same words, numbers in
// the same places) are within [0, 0.5) by how much their numbers differ;
// others within [0.5, 1] by edit distance.
func stringDistance(a, b string) float64 {
	if a == b {
		return 0
	}
	ta, tb := tokens(a), tokens(b)
	if sameShape(ta, tb) {
		var sum float64
		var n int
		for i := range ta {
			if ta[i].number {
				sum += relative(ta[i].value, tb[i].value)
				n++
			}
		}
		return 0.5 * sum / float64(n) * 0.999
	}
	longest := max(len([]rune(a)), len([]rune(b)))
	return 0.5 + 0.5*float64(levenshtein(a, b))/float64(longest)
}

type token struct {
	text   string
	number bool
	value  float64
}

// tokens splits a string into runs of digits and runs of anything else.
func tokens(s string) []token {
	var out []token
	runes := []rune(s)
	for i := 0; i < len(runes); {
		j := i
		digit := unicode.IsDigit(runes[i])
		for j < len(runes) && unicode.IsDigit(runes[j]) == digit {
			j++
		}
		t := token{text: string(runes[i:j]), number: digit}
		if digit {
			t.value, _ = strconv.ParseFloat(t.text, 64)
		}
		out = append(out, t)
		i = j
	}
	return out
}

// sameShape: the same words in the same places, with at least one number.
func sameShape(a, b []token) bool {
	if len(a) != len(b) {
		return false
	}
	numbers := false
	for i := range a {
		if a[i].number != b[i].number || (!a[i].number && a[i].text != b[i].text) {
			return false
		}
		numbers = numbers || a[i].number
	}
	return numbers
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// naturalSorted sorts values with their numbers compared as numbers:
// 1g.5gb before 1g.10gb.
func naturalSorted(values sets.Set[string]) []string {
	out := sets.List(values)
	slices.SortStableFunc(out, func(a, b string) int {
		ta, tb := tokens(a), tokens(b)
		for i := 0; i < len(ta) && i < len(tb); i++ {
			x, y := ta[i], tb[i]
			switch {
			case x.number && y.number && x.value != y.value:
				return cmp.Compare(x.value, y.value)
			case x.text != y.text:
				return strings.Compare(x.text, y.text)
			}
		}
		return cmp.Compare(len(ta), len(tb))
	})
	return out
}
