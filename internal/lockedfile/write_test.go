package lockedfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func must(data []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return data
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	for _, content := range []string{"first", "second, longer content"} {
		if err := Write(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		if got := string(must(os.ReadFile(path))); got != content {
			t.Errorf("content = %q, want %q", got, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil); err == nil {
		t.Error("Write into a missing directory succeeded")
	}
	// The rename fails: a directory is in the way. The temp file goes.
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(filepath.Join(dir, "d"), []byte("x")); !errors.Is(err, unix.EISDIR) || !strings.Contains(err.Error(), filepath.Join(dir, "d")) {
		t.Errorf("Write onto a directory = %v, want EISDIR naming the path", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want only f.json and d", len(entries))
	}
}
