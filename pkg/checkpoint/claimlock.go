package checkpoint

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"path/filepath"

	"github.com/gpudra/gpudra/internal/lockedfile"
)

// ClaimLockFileName is the file in the data directory whose bytes lock
// claims (LockClaim). Like the checkpoint's lock file it is never removed:
// a process that removed it could not know whether another one holds a
// lock in it.
const ClaimLockFileName = "claims.lock"

// LockClaim takes the lock of one claim across every process sharing the
// Store's directory (two plugin instances during a rolling update), so
// that a claim's Prepare, Unprepare and sweep, each of several
// transactions, exclude each other there as they do in one process. It
// blocks until it holds the lock or ctx ends, and returns the function
// that lets the lock go (once; calling it again does nothing).
//
// The lock is an open file description lock (F_OFD_SETLKW) on one byte of
// ClaimLockFileName, at an offset hashed from the claim UID: no file per
// claim to clean up, and with 2^62 offsets two claims share one never in
// practice. Each acquisition opens the file anew, so two acquisitions
// exclude each other inside one process too; callers still take an
// in-process lock first, so that waiters there park on a channel rather
// than in the kernel. The hash is part of the contract between plugin
// versions: changing it lets two versions hold one claim at once.
//
// The wait is [lockedfile.LockByte]'s: a caller whose context ends stops
// waiting at once.
func (s *Store) LockClaim(ctx context.Context, uid string) (unlock func(), err error) {
	path := filepath.Join(filepath.Dir(s.path), ClaimLockFileName)
	unlock, err = lockedfile.LockByte(ctx, path, claimLockOffset(uid))
	if err != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("lock claim %s: %w", uid, err)
	}
	return unlock, err
}

// claimLockOffset is the byte of ClaimLockFileName that locks a claim:
// FNV-1a of its UID, in the non-negative range of off_t less one bit.
func claimLockOffset(uid string) int64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, uid)
	return int64(h.Sum64() >> 2)
}
