package vfio

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// BusyChecker tells who holds a GPU. The caller supplies it, because only
// the caller can see the driver's clients: processes with the GPU's device
// node open, nvidia-persistenced, Fabric Manager.
type BusyChecker interface {
	// Holders returns a description of each holder of the GPU at busID,
	// such as "nvidia-persistenced (pid 1234)"; none when it is free.
	Holders(ctx context.Context, busID string) ([]string, error)
}

// ErrBusy marks the refusal to bind a GPU that something holds. Retrying
// helps once the holders let go.
var ErrBusy = errors.New("GPU is in use")

// BusyError is the refusal to bind a GPU that something holds.
type BusyError struct {
	// GPU is the PCI bus ID of the GPU.
	GPU string
	// Holders are what the BusyChecker reported.
	Holders []string
}

// Error implements error.
func (e *BusyError) Error() string {
	return fmt.Sprintf("GPU %s is in use by %s", e.GPU, strings.Join(e.Holders, ", "))
}

// Is makes errors.Is(err, ErrBusy) hold.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// NotBusy implements [BusyChecker] for callers that have nothing to check,
// such as simulated nodes without processes: it reports every GPU free.
type NotBusy struct{}

// Holders implements [BusyChecker].
func (NotBusy) Holders(context.Context, string) ([]string, error) { return nil, nil }
