package draplugin_test

import (
	"bytes"
	"maps"
	"regexp"
	"runtime"
	"slices"
	"strconv"

	"strings"
	"testing"
	"time"
)

// TestIdleNodeGoroutines reports the goroutines one idle plugin instance
// runs, by the function that started each: a process that simulates a
// thousand nodes runs a thousand of each. It reports; it asserts only
// that the plugin's own loops are among them.
func TestIdleNodeGoroutines(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the plugin to settle")
	}
	before := goroutinesByCreator()
	h := newHarness(t)
	_ = h.conn.Close() // the test's gRPC client is not the node's
	time.Sleep(2 * time.Second)
	after := goroutinesByCreator()
	total := 0
	var lines []string
	for _, creator := range slices.Sorted(maps.Keys(after)) {
		if n := after[creator] - before[creator]; n > 0 {
			total += n
			lines = append(lines, strings.Repeat(" ", 4)+creator+": "+strconv.Itoa(n))
		}
	}
	t.Logf("an idle node runs %d goroutines:\n%s", total, strings.Join(lines, "\n"))
	for _, loop := range []string{"draplugin.Start"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(after)), func(c string) bool { return strings.Contains(c, loop) }) {
			t.Errorf("no goroutine started by %s: the dump is not what this test reads", loop)
		}
	}
}

var createdBy = regexp.MustCompile(`(?m)^created by (\S+)`)

// goroutinesByCreator counts the process's goroutines by the function
// that started them, closures folded into their function.
func goroutinesByCreator() map[string]int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]int{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		creator := "main"
		if m := createdBy.FindSubmatch(g); m != nil {
			creator = regexp.MustCompile(`\.func\d+(\.\d+)*$|\.gowrap\d+$`).ReplaceAllString(string(m[1]), "")
		}
		out[creator]++
	}
	return out
}
