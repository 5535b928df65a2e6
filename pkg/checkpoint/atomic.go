package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
)

// tempInfix marks the temp files of WriteFileAtomic: <name>.tmp-<random>.
const tempInfix = ".tmp-"

// WriteFileAtomic replaces the file at path with data the way the checkpoint
// does it: write a temp file (mode 0600) in the same directory, stat it,
// rename it over path. Readers see the old content or the new, never a mix,
// and a process crash at any point leaves one of the two (plus, at worst, a
// stale temp file). It does not fsync: after a power loss the file may be
// empty or torn (docs/checkpoint.md says why the checkpoint accepts that).
func WriteFileAtomic(path string, data []byte) error {
	f, _, err := writeAtomic(path, data)
	if f != nil {
		_ = f.Close()
	}
	return err
}

// writeAtomic is WriteFileAtomic handing back the new file, still open,
// and its identity: a rename keeps the inode, size and mtime, so the temp
// file's stat is the new file's, and the Store pins the file without
// opening it again.
func writeAtomic(path string, data []byte) (*os.File, fileID, error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+tempInfix+"*")
	if err != nil {
		return nil, fileID{}, fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	var id fileID
	_, err = f.Write(data)
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil {
			id = statID(fi)
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return nil, fileID{}, fmt.Errorf("write %s: %w", path, err)
	}
	return f, id, nil
}
