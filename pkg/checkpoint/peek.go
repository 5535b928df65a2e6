package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// Peek reads the prepared claims of dir's checkpoint as the plugin would
// find them, for tools that show what the plugin would publish (`gpudra
// inspect`). It only reads: it takes no lock, moves nothing aside and
// writes nothing, so it may run beside the plugin or as another user. No
// file is a node with no prepared claims, and so is a file of an earlier
// boot, which the plugin resets. A file that cannot be read, one of a
// newer plugin, and a checkpoint that needs adoption (the
// adopt-pending marker) are errors: the prepared claims are then unknown.
func Peek(dir string, opts ...Option) (*claimstate.State, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(filepath.Join(dir, AdoptPendingFileName)); err == nil {
		return nil, fmt.Errorf("%s: %w", path, ErrNeedsAdoption)
	}
	d, err := newSchema(o).decodeFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return claimstate.New(), nil
	}
	if err != nil {
		return nil, err
	}
	if d.bootID != "" {
		if boot, err := readBootID(o.bootIDPath); err == nil && boot != d.bootID {
			return claimstate.New(), nil
		}
	}
	return d.state, nil
}

// decodeFile reads and decodes the file at path, refusing one larger than
// maxFileSize, for readers that neither lock nor pin it (Peek, the start
// record files). Its errors name the path; a missing file's matches
// fs.ErrNotExist.
func (sc schema) decodeFile(path string) (decoded, error) {
	f, err := os.Open(path)
	if err != nil {
		return decoded{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return decoded{}, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return decoded{}, fmt.Errorf("%s: larger than %d bytes", path, maxFileSize)
	}
	d, err := sc.decode(data)
	if err != nil {
		return decoded{}, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}
