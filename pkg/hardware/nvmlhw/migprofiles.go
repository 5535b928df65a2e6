package nvmlhw

import (
	"fmt"
	"slices"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// spanningCIProfiles maps the compute slices of a GPU instance to the
// NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance spanning all of
// them. NVML describes compute instance profiles only within an existing
// GPU instance, which discovery must not create, so the profile follows
// from the slice count; its engine profile is always the shared one, the
// only one NVML defines.
var spanningCIProfiles = map[uint32]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// spanningCIProfile returns the compute instance profile spanning a GPU
// instance of profile p.
func spanningCIProfile(p giProfile) (int, error) {
	ci, ok := spanningCIProfiles[p.info.SliceCount]
	if !ok {
		return 0, fmt.Errorf("GPU instance profile %d has %d compute slices, which no compute instance profile spans",
			p.info.Id, p.info.SliceCount)
	}
	return ci, nil
}

// migProfiles describes the GPU instance profiles of dev, a GPU with
// memoryBytes of memory, with their possible placements, and returns them
// with the number of memory slices the placements cover. A profile without
// any possible placement cannot be created and is left out.
func migProfiles(devlib nvdev.Interface, dev nvml.Device, profiles giProfileList, memoryBytes uint64) ([]hardware.MIGProfile, int, error) {
	var out []hardware.MIGProfile
	memorySlices := 0
	for _, p := range profiles {
		info := p.info
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, 0, queryFailed(fmt.Sprintf("nvmlDeviceGetGpuInstancePossiblePlacements(profile %d)", info.Id), ret)
		}
		if len(placements) == 0 {
			continue
		}
		size := placements[0].Size
		starts := make([]int, 0, len(placements))
		for _, pl := range placements {
			if pl.Size != size {
				return nil, 0, queryFailed(fmt.Sprintf("nvmlDeviceGetGpuInstancePossiblePlacements(profile %d)", info.Id),
					fmt.Errorf("GPU instance profile %d has placements of sizes %d and %d", info.Id, size, pl.Size))
			}
			starts = append(starts, int(pl.Start))
			memorySlices = max(memorySlices, int(pl.Start+pl.Size))
		}
		slices.Sort(starts)
		ci, err := spanningCIProfile(p)
		if err != nil {
			return nil, 0, queryFailed(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", p.index), err)
		}
		// go-nvlib builds the name nvidia-smi shows ("1g.10gb+me").
		name, err := devlib.NewMigProfile(p.index, ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, memoryBytes)
		if err != nil {
			return nil, 0, queryFailed(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", p.index), fmt.Errorf("name of GPU instance profile %d: %w", info.Id, err))
		}
		out = append(out, hardware.MIGProfile{
			Name:            name.String(),
			GIProfileID:     p.index,
			ProfileID:       int(info.Id),
			CIProfileID:     ci,
			CIEngProfileID:  nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
			Slices:          int(info.SliceCount),
			Instances:       int(info.InstanceCount),
			MemoryBytes:     info.MemorySizeMB * 1024 * 1024, // NVML's "MB" is MiB (nvml.h)
			Multiprocessors: int(info.MultiprocessorCount),
			CopyEngines:     int(info.CopyEngineCount),
			Decoders:        int(info.DecoderCount),
			Encoders:        int(info.EncoderCount),
			JPEGEngines:     int(info.JpegCount),
			OFAEngines:      int(info.OfaCount),
			PlacementSize:   int(size),
			PlacementStarts: starts,
		})
	}
	return out, memorySlices, nil
}
