// Package lockedfile holds what processes sharing state through files
// need: files replaced atomically ([Write], [Replace]) and locks that
// exclude other processes and other descriptors of this one ([Mutex], a
// flock(2) a context stops waiting for; [LockByte], an open file
// description lock on one byte of a file; [Exclusive], a plain blocking
// flock). The checkpoint, the CDI specs, the time slices and the
// simulated hardware of two plugin instances during a rolling update use
// it.
package lockedfile
