package preparer

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// IntentOf reads what the claim asks of this driver from its allocation:
// its consumers and the devices with their CDI IDs.
func IntentOf(claim *resourceapi.ResourceClaim, driverName, pool string) (claimstate.Intent, error) {
	intent := claimstate.Intent{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name}
	if claim.Status.Allocation == nil {
		return intent, fmt.Errorf("claim is not allocated")
	}
	intent.Consumers = ConsumersOf(claim)
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName {
			continue
		}
		if r.Pool != pool {
			return intent, fmt.Errorf("request %s: device %s is from pool %q, but this node's pool is %q", r.Request, r.Device, r.Pool, pool)
		}
		cd := claimstate.Device{
			Requests:    []string{r.Request},
			Pool:        r.Pool,
			Name:        r.Device,
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
		}
		if r.ShareID != nil {
			cd.ShareID = string(*r.ShareID)
		}
		cd.CDIDeviceIDs = []string{cdi.DeviceID(driverName, string(claim.UID), cdi.ShareName(r.Device, cd.ShareID))}
		intent.Devices = append(intent.Devices, cd)
	}
	return intent, nil
}

// ConsumersOf returns what a claim is reserved for: pods, a PodGroup
// whose pods share the claim (KEP-5729), or any other kind
// status.reservedFor names, in its order.
func ConsumersOf(claim *resourceapi.ResourceClaim) []claimstate.Consumer {
	var out []claimstate.Consumer
	for _, ref := range claim.Status.ReservedFor {
		out = append(out, claimstate.NewConsumer(ref.APIGroup, ref.Resource, ref.Name, string(ref.UID)))
	}
	return out
}

func kubeletDevices(devices []claimstate.Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(devices))
	for _, d := range devices {
		kd := kubeletplugin.Device{
			Requests:     d.Requests,
			PoolName:     d.Pool,
			DeviceName:   d.Name,
			CDIDeviceIDs: d.CDIDeviceIDs,
		}
		if d.ShareID != "" {
			id := types.UID(d.ShareID)
			kd.ShareID = &id
		}
		out = append(out, kd)
	}
	return out
}

// sameIdentity compares devices by pool, name and shareID.
func sameIdentity(a, b []claimstate.Device) bool {
	return slices.Equal(identities(a), identities(b))
}

func identities(ds []claimstate.Device) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		id := d.Pool + "/" + d.Name
		if d.ShareID != "" {
			id += "@" + d.ShareID
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
