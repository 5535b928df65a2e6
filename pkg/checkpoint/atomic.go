package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
)

// tempInfix marks the temp files of WriteFileAtomic: <name>.tmp-<random>.
const tempInfix = ".tmp-"

// WriteFileAtomic replaces the file at path with data the way the checkpoint
// does it: write a temp file (mode 0600) in the same directory, close it,
// rename it over path. Readers see the old content or the new, never a mix,
// and a process crash at any point leaves one of the two (plus, at worst, a
// stale temp file). It does not fsync: after a power loss the file may be
// empty or torn (docs/checkpoint.md says why the checkpoint accepts that).
func WriteFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+tempInfix+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
