package explain

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
)

// TestClauses: selectors split at their top-level && into clauses that
// compile alone, keep their source text, and say which attribute they
// compare when they do.
func TestClauses(t *testing.T) {
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	for _, tc := range []struct {
		expr  string
		texts []string
		shown []string
	}{
		{
			expr:  `device.attributes['gpu.nvidia.com'].profile == '1g.20gb'`,
			texts: []string{`device.attributes['gpu.nvidia.com'].profile == '1g.20gb'`},
			shown: []string{`profile == "1g.20gb"`},
		},
		{
			expr: `device.driver == 'gpu.nvidia.com' && (device.attributes["gpu.nvidia.com"].type == "gpu" || device.attributes["gpu.nvidia.com"].type == "mig") &&
				device.capacity['gpu.nvidia.com'].memory.compareTo(quantity("40Gi")) >= 0 && device.attributes["gpu.nvidia.com"]["productName"].startsWith("NVIDIA")`,
			texts: []string{
				`device.driver == 'gpu.nvidia.com'`,
				`device.attributes["gpu.nvidia.com"].type == "gpu" || device.attributes["gpu.nvidia.com"].type == "mig"`,
				`device.capacity['gpu.nvidia.com'].memory.compareTo(quantity("40Gi")) >= 0`,
				`device.attributes["gpu.nvidia.com"]["productName"].startsWith("NVIDIA")`,
			},
			shown: []string{
				`driver == "gpu.nvidia.com"`,
				`device.attributes["gpu.nvidia.com"].type == "gpu" || device.attributes["gpu.nvidia.com"].type == "mig"`,
				`memory >= 40Gi`,
				`device.attributes["gpu.nvidia.com"]["productName"].startsWith("NVIDIA")`,
			},
		},
		{
			// Another domain keeps its name; a constant on the left flips
			// the comparison.
			expr:  `8 <= device.attributes['resource.kubernetes.io'].numaNode && device.attributes['gpu.nvidia.com']['index'] != 3`,
			texts: []string{`8 <= device.attributes['resource.kubernetes.io'].numaNode`, `device.attributes['gpu.nvidia.com']['index'] != 3`},
			shown: []string{`resource.kubernetes.io/numaNode >= 8`, `index != 3`},
		},
		{
			// Not CEL: one clause, whose compile error the report names.
			expr:  `device.attributes[`,
			texts: []string{`device.attributes[`},
			shown: []string{`device.attributes[`},
		},
	} {
		cls := clauses(cache, "request", 0, tc.expr)
		var texts, shown []string
		for _, c := range cls {
			texts = append(texts, c.expr)
			shown = append(shown, c.text("gpu.nvidia.com"))
		}
		if !reflect.DeepEqual(texts, tc.texts) || !reflect.DeepEqual(shown, tc.shown) {
			t.Errorf("clauses(%s)\n got %q\n     %q\nwant %q\n     %q", tc.expr, texts, shown, tc.texts, tc.shown)
		}
	}
}

// TestValueDistance: values that differ only in their numbers are nearer
// than values that differ in words, and smaller differences nearer still.
func TestValueDistance(t *testing.T) {
	want := "1g.20gb"
	order := []string{"1g.20gb", "3g.20gb", "1g.5gb", "2g.10gb", "1g.20gb+me", "7g.80gb+gfx", "NVIDIA H100"}
	for i := 1; i < len(order); i++ {
		near, far := valueDistance(order[i-1], want), valueDistance(order[i], want)
		if near >= far {
			t.Errorf("distance(%s) = %v, not nearer than distance(%s) = %v", order[i-1], near, order[i], far)
		}
	}
	if d := valueDistance(int64(40), int64(80)); d != 0.5 {
		t.Errorf("distance(40, 80) = %v, want 0.5", d)
	}
	if d := valueDistance(true, "x"); d != 1 {
		t.Errorf("distance of unlike types = %v, want 1", d)
	}
}

func TestNaturalSorted(t *testing.T) {
	got := naturalSorted(sets.New("1g.10gb", "1g.5gb", "1g.10gb+me", "2g.20gb", "1g.20gb", "7g.80gb"))
	want := []string{"1g.5gb", "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "7g.80gb"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
