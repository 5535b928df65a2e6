package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// With --log-file, every line is in the file once, errors included (klog
// writes an error to each lower severity's output too).
func TestLogFileHasEachLineOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sim.log")
	done, err := setUpLogging(logging{file: path})
	if err != nil {
		t.Fatal(err)
	}
	klog.ErrorS(errors.New("boom"), "an error line")
	klog.Warning("a warning line")
	klog.InfoS("an info line")
	done()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"an error line", "a warning line", "an info line"} {
		if n := strings.Count(string(data), line); n != 1 {
			t.Errorf("%q is in the log file %d times, want once:\n%s", line, n, data)
		}
	}
}
