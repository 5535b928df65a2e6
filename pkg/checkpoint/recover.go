package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"time"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// AdoptPendingFileName is the marker in the data directory that says the
// checkpoint was lost (an unreadable file was moved aside) and the claims
// prepared on the node have not been adopted yet. It is written before the
// file is moved aside and removed by [Store.Recover] once the adopted state
// is written, so that no process sharing the directory ever takes the
// missing file for "no claims prepared".
const AdoptPendingFileName = "checkpoint.adopt-pending"

// ErrNeedsAdoption is matched (with errors.Is) by the errors of a Store
// whose checkpoint was lost: an unreadable file was moved aside, by this
// Store or another sharing the directory, and the claims prepared on the
// node must be adopted (from what survives elsewhere, such as their CDI
// specs) with [Store.Recover] before anything else is prepared. Until then
// the state is incomplete: a conflict check against it could hand a device
// in use to a second claim. The error is temporary: retry once the owner
// has recovered.
var ErrNeedsAdoption = errors.New("checkpoint was lost: the claims prepared on this node must be adopted before anything else is prepared; retry once they are")

// lossRecord is the content of the adopt-pending marker.
type lossRecord struct {
	// BootID is the boot the loss happened in; a marker of another boot is
	// void, since a reboot reset what the lost file described.
	BootID string `json:"bootID"`
	// MovedTo is where the unreadable file went.
	MovedTo string `json:"movedTo"`
	// Reason says why it could not be read.
	Reason string `json:"reason"`
	// Since is when it was moved aside.
	Since time.Time `json:"since"`
}

// needsAdoptionError is the error of every call but Recover while a loss is
// pending.
type needsAdoptionError struct {
	path string
	lost *lossRecord
}

func (e *needsAdoptionError) Error() string {
	return fmt.Sprintf("checkpoint %s: %v (%s)", e.path, ErrNeedsAdoption, e.lost.describe())
}

// Is makes errors.Is(err, ErrNeedsAdoption) hold.
func (e *needsAdoptionError) Is(target error) bool { return target == ErrNeedsAdoption }

func (l *lossRecord) describe() string {
	if l.MovedTo == "" {
		return l.Reason
	}
	return fmt.Sprintf("unreadable file moved to %s at %s: %s", l.MovedTo, l.Since.Format(time.RFC3339), l.Reason)
}

// corruptFile describes the loss as a CorruptFile for the Open report and
// the corrupt handler of a Store that did not move the file aside itself.
func (l *lossRecord) corruptFile() *CorruptFile {
	return &CorruptFile{
		Path: l.MovedTo,
		Err:  fmt.Errorf("claims of a lost checkpoint not adopted yet (%s is there): %s", AdoptPendingFileName, l.describe()),
	}
}

// Recover applies mutate like Update, and also while the checkpoint needs
// adoption ([ErrNeedsAdoption]), which Update and Read refuse. mutate sees
// what is left of the state (usually nothing) and adds what the owner
// adopted. Once its result is written, the adopt-pending marker is removed
// in the same hold of the flock, so that every later call, in any process
// sharing the directory, sees the adopted state. When no adoption is
// pending, Recover is an Update. If mutate fails, or the write or the
// marker's removal fails, the checkpoint still needs adoption.
//
// Requests queued while adoption is pending fail in queue order until a
// Recover succeeds; those queued after it then apply to the recovered
// state.
func (s *Store) Recover(ctx context.Context, mutate func(*claimstate.State) error) error {
	if mutate == nil {
		return errors.New("checkpoint: Recover with a nil mutation")
	}
	return s.do(ctx, &request{mutate: mutate, recover: true})
}

// NeedsAdoption reports whether, as of this Store's latest look at the
// directory, the checkpoint was lost and its claims are not adopted yet:
// every call but Recover then fails with ErrNeedsAdoption. Another process
// may have recovered since; the next call will tell.
func (s *Store) NeedsAdoption() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pub.lost != nil
}

// RequireAdoption makes the checkpoint need adoption, as a lost one does,
// in this Store and in every process sharing the directory, until a
// Recover succeeds: for an owner that finds claims prepared on the node
// that the checkpoint does not record and that it cannot adopt yet (at
// the first start on a node, with no checkpoint, nothing else would stop
// the next Update from deciding against a state that lacks them). The
// state the file holds stays, and Recover's mutation sees it. reason is
// recorded in the adopt-pending marker and in the errors of the calls
// refused meanwhile. It does nothing while adoption is pending already.
func (s *Store) RequireAdoption(ctx context.Context, reason string) error {
	return s.do(ctx, &request{requireAdoption: &lossRecord{BootID: s.bootID, Reason: reason, Since: s.now()}})
}

func requiresAdoption(r *request) bool { return r.requireAdoption != nil }

// serveWhileLost serves the requests of a batch in order while a loss is
// pending, or may become pending in the batch (RequireAdoption): each
// fails until a Recover succeeds. It returns the requests after that
// Recover, which apply normally; none if none succeeded.
func (s *Store) serveWhileLost(batch []*request) (rest []*request) {
	for i, r := range batch {
		if r.requireAdoption != nil {
			if s.cur.lost == nil {
				r.err = s.markLost(r.requireAdoption)
			}
			continue
		}
		if s.cur.lost == nil {
			if !slices.ContainsFunc(batch[i+1:], requiresAdoption) {
				return batch[i:]
			}
			// Before a RequireAdoption of the same batch: in order, alone.
			if r.mutate == nil {
				r.state = s.cur.state.Clone()
				continue
			}
			if next, ok := r.apply(s.cur.state, s.schema); ok {
				if err := s.persist(next); err != nil {
					r.err = err
				}
			}
			continue
		}
		if !r.recover {
			r.err = &needsAdoptionError{path: s.path, lost: s.cur.lost}
			continue
		}
		next, ok := r.apply(s.cur.state, s.schema)
		if !ok {
			continue
		}
		if err := s.persist(next); err != nil {
			r.err = err
			continue
		}
		if err := s.removeMarker(); err != nil {
			r.err = fmt.Errorf("recovered state written, but the checkpoint still needs adoption: %w", err)
			continue
		}
		s.logger.Info("Checkpoint recovered: adopted claims written", "lostFile", s.cur.lost.MovedTo, "claims", len(next.Claims))
		s.cur.lost = nil
	}
	return nil
}

// readMarker returns the pending loss the marker records, nil if there is
// none. A marker of a previous boot is removed. An unreadable marker of
// this boot still means a loss is pending: its absence, not its content,
// is what lets Update go on.
func (s *Store) readMarker() (*lossRecord, error) {
	f, fi, err := openRegular(s.markerPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var rec lossRecord
	var readErr error
	if err == nil {
		data, rerr := io.ReadAll(io.LimitReader(f, 1<<20))
		_ = f.Close()
		if rerr == nil {
			rerr = json.Unmarshal(data, &rec)
		}
		if rerr == nil && rec.BootID == "" {
			rerr = errors.New("no bootID")
		}
		readErr = rerr
	} else {
		readErr = err
		if lfi, lerr := os.Lstat(s.markerPath); lerr == nil {
			fi = lfi
		}
	}
	stale := rec.BootID != "" && rec.BootID != s.bootID
	if readErr != nil && fi != nil && !s.bootTime.IsZero() && fi.ModTime().Before(s.bootTime) {
		stale = true
	}
	if stale {
		if err := os.Remove(s.markerPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger.Error(err, "Cannot remove the adopt-pending marker of a previous boot", "path", s.markerPath)
		} else {
			s.logger.Info("Removed the adopt-pending marker of a previous boot: the reboot reset what the lost checkpoint described", "path", s.markerPath)
		}
		return nil, nil
	}
	if readErr != nil {
		return &lossRecord{
			BootID: s.bootID,
			Reason: fmt.Sprintf("%s is unreadable (%v): the claims of an earlier lost checkpoint were not adopted", s.markerPath, readErr),
		}, nil
	}
	return &rec, nil
}

// markLost records a pending loss of the checkpoint, which stays where it
// is, in the marker.
func (s *Store) markLost(rec *lossRecord) error {
	if err := s.writeMarker(rec); err != nil {
		return fmt.Errorf("write %s: %w", s.markerPath, err)
	}
	mid, err := statPath(s.markerPath)
	if err != nil {
		mid = fileID{} // unknown: the next refresh reads it again
	}
	s.cur.lost, s.cur.markerID = rec, mid
	s.logger.Error(nil, "Checkpoint needs adoption; nothing is served until the claims on the node are adopted", "reason", rec.Reason)
	return nil
}

func (s *Store) writeMarker(rec *lossRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return lockedfile.Write(s.markerPath, append(data, '\n'))
}

func (s *Store) removeMarker() error {
	if err := os.Remove(s.markerPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", s.markerPath, err)
	}
	s.cur.markerID = fileID{missing: true}
	return nil
}
