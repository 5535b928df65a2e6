package lockedfile

import "context"

// Exclusive takes an exclusive flock(2) on the file at path, made if
// missing, waiting for it as long as it takes, and returns the function
// that releases it: [Mutex.Lock] without a context. Two calls exclude each
// other within one process too.
func Exclusive(path string) (unlock func(), err error) {
	return NewMutex(path).Lock(context.Background())
}
