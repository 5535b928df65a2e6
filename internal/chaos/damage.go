package chaos

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gpudra/gpudra/pkg/checkpoint"
)

// damage is a way the checkpoint is lost while the plugin is down: an
// operator or a tool deletes the file, a restore leaves a symlink to a
// file that is not there, a full disk or a copy cuts it short.
type damage string

const (
	damageDelete   damage = "deleted"
	damageDangling damage = "dangling-link"
	damageTruncate damage = "truncated"
)

var damages = []damage{damageDelete, damageDangling, damageTruncate}

// killDuringAdoption is the chance that the start after a damage
// (Options.LossProbability) is killed within maxAdoptionKillDelay, while
// it looks for evidence of the loss, writes the adopt-pending marker,
// moves the file aside and adopts.
const (
	killDuringAdoption   = 0.6
	maxAdoptionKillDelay = 100 * time.Millisecond
)

// damageCheckpoint damages the checkpoint of the plugin, which is down,
// in a random way. It returns the damage done, "" when there was no file
// to damage.
func (t *trial) damageCheckpoint() (damage, error) {
	path := filepath.Join(t.n.pluginDir(), checkpoint.FileName)
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.Mode().IsRegular()) {
		return "", nil // lost already, and not adopted yet
	}
	if err != nil {
		return "", err
	}
	d := damages[t.rng.IntN(len(damages))]
	switch d {
	case damageDelete:
		err = os.Remove(path)
	case damageDangling:
		if err = os.Remove(path); err == nil {
			err = os.Symlink(checkpoint.FileName+".gone", path)
		}
	case damageTruncate:
		var data []byte
		if data, err = os.ReadFile(path); err == nil {
			err = os.WriteFile(path, data[:t.rng.IntN(max(len(data), 1))], 0o644)
		}
	}
	if err != nil {
		return "", fmt.Errorf("damage the checkpoint (%s): %w", d, err)
	}
	t.sum.Damages[d]++
	t.trace("checkpoint %s while the plugin is down", d)
	return d, nil
}
