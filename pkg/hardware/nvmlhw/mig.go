package nvmlhw

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// errPartialCI marks compute instances smaller than their GPU instance.
// gpudra models a MIG device as a GPU instance with one compute instance
// spanning it; the several compute instances of a split GPU instance would
// share its placement, and so the one device name derived from it.
var errPartialCI = errors.New("partial compute instances are not supported")

// giProfile is one GPU instance profile a GPU supports.
type giProfile struct {
	index int // NVML_GPU_INSTANCE_PROFILE_*
	info  nvml.GpuInstanceProfileInfo
}

// giProfileList is a GPU's instance profiles in NVML profile index order.
type giProfileList []giProfile

// byID returns the profile whose ID (the number GpuInstanceInfo.ProfileId
// and nvidia-smi refer to) is id.
func (l giProfileList) byID(id uint32) (giProfile, bool) {
	for _, p := range l {
		if p.info.Id == id {
			return p, true
		}
	}
	return giProfile{}, false
}

// ids lists the profile IDs for error messages.
func (l giProfileList) ids() string {
	s := make([]string, len(l))
	for i, p := range l {
		s[i] = fmt.Sprint(p.info.Id)
	}
	return strings.Join(s, ", ")
}

// giProfiles returns the GPU's instance profiles. NVML answers with MIG
// mode off too. Profiles the GPU does not support are skipped; any other
// failure is a [queryError].
func giProfiles(dev nvml.Device) (giProfileList, error) {
	var profiles giProfileList
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		switch ret {
		case nvml.SUCCESS:
			profiles = append(profiles, giProfile{index: i, info: info})
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		default:
			return nil, queryFailed(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", i), ret)
		}
	}
	return profiles, nil
}

// ciProfile is the compute instance profile of one compute instance.
type ciProfile struct {
	index    int // NVML_COMPUTE_INSTANCE_PROFILE_*
	engIndex int // NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_*
	info     nvml.ComputeInstanceProfileInfo
}

// ciProfileOf finds the compute instance profile with ID id in gi.
func ciProfileOf(gi nvml.GpuInstance, id uint32) (ciProfile, error) {
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		for e := 0; e < nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT; e++ {
			info, ret := gi.GetComputeInstanceProfileInfo(p, e)
			switch ret {
			case nvml.SUCCESS:
				if info.Id == id {
					return ciProfile{index: p, engIndex: e, info: info}, nil
				}
			case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
			default:
				return ciProfile{}, fmt.Errorf("nvmlGpuInstanceGetComputeInstanceProfileInfo(%d, %d): %w", p, e, ret)
			}
		}
	}
	return ciProfile{}, fmt.Errorf("no compute instance profile has ID %d", id)
}

// readMIGDevices returns the MIG devices that exist on a MIG-enabled GPU,
// ordered by (GIProfileID, PlacementStart), and a problem for each one left
// out. memErr, if set, says why the GPU's total memory is unknown. An error
// (a [queryError]) means that the GPU's MIG devices cannot be listed at all.
func (g *gpuReader) readMIGDevices(dev nvml.Device, gpu hardware.GPU, profiles giProfileList, memErr error) ([]hardware.MIGDevice, []hardware.Problem, error) {
	maxCount, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nil, queryFailed("nvmlDeviceGetMaxMigDeviceCount", ret)
	}
	var migs []hardware.MIGDevice
	var problems []hardware.Problem
	for j := 0; j < maxCount; j++ {
		handle, ret := dev.GetMigDeviceHandleByIndex(j)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
			continue // no MIG device in this slot
		default:
			return nil, nil, queryFailed(fmt.Sprintf("nvmlDeviceGetMigDeviceHandleByIndex(%d)", j), ret)
		}
		// Without its UUID a MIG device cannot be reported on its own.
		uuid, ret := handle.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, nil, queryFailed(fmt.Sprintf("nvmlDeviceGetUUID(MIG device %d)", j), ret)
		}
		mig, err := g.readMIGDevice(dev, gpu, profiles, handle, memErr)
		if err != nil {
			problems = append(problems, hardware.Problem{
				Index: gpu.Index, UUID: gpu.UUID, MIGDevice: uuid,
				Err: fmt.Sprintf("%s: MIG device %s: %v", gpuName(gpu.Index, gpu.UUID), uuid, err),
			})
			continue
		}
		mig.UUID = uuid
		migs = append(migs, mig)
	}
	slices.SortFunc(migs, func(a, b hardware.MIGDevice) int {
		return cmp.Or(cmp.Compare(a.GIProfileID, b.GIProfileID), cmp.Compare(a.PlacementStart, b.PlacementStart))
	})
	return migs, problems, nil
}

// readMIGDevice reads the MIG device behind handle, all but its UUID.
func (g *gpuReader) readMIGDevice(parent nvml.Device, gpu hardware.GPU, profiles giProfileList, handle nvml.Device, memErr error) (hardware.MIGDevice, error) {
	fail := func(call string, err error) (hardware.MIGDevice, error) {
		return hardware.MIGDevice{}, fmt.Errorf("%s: %w", call, err)
	}
	giID, ret := handle.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetGpuInstanceId", ret)
	}
	ciID, ret := handle.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetComputeInstanceId", ret)
	}
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlDeviceGetGpuInstanceById(%d)", giID), ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlGpuInstanceGetInfo(GI %d)", giID), ret)
	}
	ci, ret := gi.GetComputeInstanceById(ciID)
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlGpuInstanceGetComputeInstanceById(GI %d, CI %d)", giID, ciID), ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlComputeInstanceGetInfo(GI %d, CI %d)", giID, ciID), ret)
	}
	profile, ok := profiles.byID(giInfo.ProfileId)
	if !ok {
		return fail("GPU instance profile", fmt.Errorf("GI %d has profile ID %d, which the GPU does not list", giID, giInfo.ProfileId))
	}
	cip, err := ciProfileOf(gi, ciInfo.ProfileId)
	if err != nil {
		return fail(fmt.Sprintf("compute instance profile of GI %d, CI %d", giID, ciID), err)
	}
	if cip.info.SliceCount != profile.info.SliceCount {
		return hardware.MIGDevice{}, fmt.Errorf("%w: CI %d has %d of the %d compute slices of GI %d",
			errPartialCI, ciID, cip.info.SliceCount, profile.info.SliceCount, giID)
	}
	// go-nvlib derives the "<n>gb" of a profile name from the GPU's total
	// memory; without it a name would be a guess.
	if memErr != nil {
		return fail("MIG profile name", fmt.Errorf("the GPU's total memory is unknown: %w", memErr))
	}
	// go-nvlib builds the name nvidia-smi shows ("1g.10gb", "1g.10gb+me").
	name, err := g.devlib.NewMigProfile(profile.index, cip.index, cip.engIndex, profile.info.MemorySizeMB, gpu.MemoryBytes)
	if err != nil {
		return fail("MIG profile name", err)
	}
	caps, err := g.migCapMinors()
	if err != nil {
		return hardware.MIGDevice{}, err
	}
	giCap, ok := caps.GI(gpu.Minor, giID)
	if !ok {
		return fail("MIG capability minors", fmt.Errorf("no entry gpu%d/gi%d/access", gpu.Minor, giID))
	}
	ciCap, ok := caps.CI(gpu.Minor, giID, ciID)
	if !ok {
		return fail("MIG capability minors", fmt.Errorf("no entry gpu%d/gi%d/ci%d/access", gpu.Minor, giID, ciID))
	}

	info := profile.info
	return hardware.MIGDevice{
		Profile:         name.String(),
		GIProfileID:     profile.index,
		ProfileID:       int(info.Id),
		CIProfileID:     cip.index,
		CIEngProfileID:  cip.engIndex,
		GIID:            giID,
		CIID:            ciID,
		PlacementStart:  int(giInfo.Placement.Start),
		PlacementSize:   int(giInfo.Placement.Size),
		MemoryBytes:     info.MemorySizeMB * 1024 * 1024, // NVML's "MB" is MiB (nvml.h)
		Multiprocessors: int(info.MultiprocessorCount),
		CopyEngines:     int(info.CopyEngineCount),
		Decoders:        int(info.DecoderCount),
		Encoders:        int(info.EncoderCount),
		JPEGEngines:     int(info.JpegCount),
		OFAEngines:      int(info.OfaCount),
		GICapMinor:      giCap,
		CICapMinor:      ciCap,
	}, nil
}
