package devicemodel

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ShareLimits are the caps of one share of a shared GPU: what its MPS
// daemon is started with. They are caps, not reservations: a share may use
// less, and nothing keeps SMs free for a share while others are busy.
type ShareLimits struct {
	// PinnedMemoryBytes caps the device memory the share's clients may
	// pin; 0 leaves it uncapped. When set it is at least 1 MiB, the least
	// an MPS daemon takes.
	PinnedMemoryBytes int64
	// ActiveThreadPercentage caps the share of the GPU's SMs the share's
	// clients may use, 1 to 100; 0 leaves it uncapped.
	ActiveThreadPercentage int
}

// ShareLimits turns what one share of d consumed (its allocation result's
// consumedCapacity) into the share's limits:
//
//   - memory-compute: the memory consumed, and the compute consumed as
//     the SM percentage (0: uncapped);
//   - shares=N: k shares consumed are k/N of the memory and of the SMs,
//     both rounded down, so that the caps of all shares of a GPU never add
//     up to more than the GPU;
//   - unlimited: the memory consumed, if any; compute is uncapped.
//
// A share that consumed the whole GPU (all its memory, or all N shares),
// which is what a claim that asks for no capacity gets by default, has no
// caps: it is the whole GPU, which needs no MPS daemon to cap it, and
// takes time-slicing and MPS settings as an unshared GPU does. A cap of
// all the memory or of 100 % of the SMs caps nothing, so it is left out.
//
// It fails when d is not shared, and when consumed is not what d's
// request policies can give: a capacity is missing (the node's sharing
// changed since the claim was allocated) or out of range.
func (d *Device) ShareLimits(consumed map[resourceapi.QualifiedName]resource.Quantity) (ShareLimits, error) {
	if !d.Sharing.Enabled() {
		return ShareLimits{}, fmt.Errorf("device %s: not published for sharing, so it has no share limits", d.Name())
	}
	total := int64(d.GPU.MemoryBytes)
	get := func(name resourceapi.QualifiedName, lo, hi int64) (int64, error) {
		q, ok := consumed[name]
		if !ok {
			return 0, fmt.Errorf("device %s (sharing %s): consumed capacity has no %q; was the claim allocated under another sharing mode?", d.Name(), d.Sharing, name)
		}
		v, ok := q.AsInt64()
		if !ok || v < lo || v > hi {
			return 0, fmt.Errorf("device %s (sharing %s): consumed %s %s is not a whole number from %d to %d", d.Name(), d.Sharing, name, q.String(), lo, hi)
		}
		return v, nil
	}
	switch d.Sharing.Mode {
	case SharingMemoryCompute:
		memory, err := get(CapMemory, minShareMemory, total)
		if err != nil {
			return ShareLimits{}, err
		}
		compute, err := get(CapCompute, 0, 100)
		if err != nil {
			return ShareLimits{}, err
		}
		return uncapWhole(ShareLimits{PinnedMemoryBytes: memory, ActiveThreadPercentage: int(compute)}, total), nil
	case SharingShares:
		n := int64(d.Sharing.Shares)
		k, err := get(CapShares, 1, n)
		if err != nil {
			return ShareLimits{}, err
		}
		if _, err := get(CapMemory, 0, 0); err != nil {
			return ShareLimits{}, err
		}
		// total*k stays far below 2^63: k <= 100 and no GPU has 2^56 bytes.
		return uncapWhole(ShareLimits{PinnedMemoryBytes: max(total*k/n, minShareMemory), ActiveThreadPercentage: int(100 * k / n)}, total), nil
	case SharingUnlimited:
		memory, err := get(CapMemory, 0, total)
		if err != nil {
			return ShareLimits{}, err
		}
		if memory > 0 {
			memory = max(memory, minShareMemory)
		}
		return uncapWhole(ShareLimits{PinnedMemoryBytes: memory}, total), nil
	}
	return ShareLimits{}, fmt.Errorf("device %s: sharing %s has no share limits", d.Name(), d.Sharing)
}

// uncapWhole leaves out the caps of l that cap nothing on a GPU of total
// bytes: all of its memory, 100 % of its SMs.
func uncapWhole(l ShareLimits, total int64) ShareLimits {
	if l.PinnedMemoryBytes >= total {
		l.PinnedMemoryBytes = 0
	}
	if l.ActiveThreadPercentage >= 100 {
		l.ActiveThreadPercentage = 0
	}
	return l
}
