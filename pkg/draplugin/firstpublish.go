package draplugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// probeTimeout bounds the dry-run probe: an API server that does not
// answer must not hold the plugin's start for long.
const probeTimeout = 10 * time.Second

// probeAPIFeatures creates [devicemodel.FeatureProbe] as a dry run and
// turns off every fallback whose fields the API server dropped from it,
// before anything is published: a first publication with fields the API
// server drops would, until the ResourceSlice controller reports them
// (HandleError) and the plugin publishes again, offer devices whose
// exclusions the scheduler cannot see, such as a full GPU and a MIG device
// of it. A probe that fails (RBAC, network) is logged, and HandleError
// remains the only guard, as it stays for an API server downgraded while
// the plugin runs.
func (d *Driver) probeAPIFeatures(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if len(d.features.Fallbacks()) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	probe := devicemodel.FeatureProbe(d.cfg.DriverName, d.cfg.NodeName)
	got, err := draclient.New(d.cfg.KubeClient).ResourceSlices().Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		logger.Error(err, "Probing the API server's ResourceSlice features with a dry-run create failed; publishing as configured, and falling back if the API server drops fields")
		return
	}
	dropped := &resourceslice.DroppedFieldsError{PoolName: d.cfg.NodeName, DesiredSlice: probe, ActualSlice: got}
	disabled := dropped.DisabledFeatures()
	logger.V(2).Info("Probed the API server's ResourceSlice features", "disabledFeatures", disabled)
	if len(disabled) > 0 {
		d.fallBack(logger.WithValues("probe", probe.Name, "disabledFeatures", disabled), dropped, disabled)
	}
}

// fallBack turns off the fallbacks of the features the API server lacks,
// and says so in the log and a Node event; it reports whether any was on.
func (d *Driver) fallBack(logger klog.Logger, err error, disabled []string) bool {
	fellBack := false
	for _, f := range d.features.Fallbacks() {
		if slices.Contains(disabled, f.Feature) && f.On.Swap(false) {
			logger.Error(err, f.Log)
			d.Event(corev1.EventTypeWarning, f.Reason, f.Event)
			fellBack = true
		}
	}
	return fellBack
}

// publishFirst creates the node's ResourceSlices itself, exactly as the
// ResourceSlice controller would create them, before the helper starts
// the controller: the controller waits for its informer in steps of a
// second (resourceslice.Controller's initInformer polls HasSynced every
// second, and no option changes that), so its first publication comes a
// second or more after the plugin starts. Once synced, the controller
// finds these slices up to date and writes nothing.
//
// It does nothing when the API server has slices of this node and driver
// already (an earlier plugin process published them; the controller
// reconciles them), and it stops at the first error: the controller
// publishes what is missing. A slice whose fields the API server dropped
// is reported to HandleError, as the controller would. Two plugin
// processes publishing at once (a rolling update) may both create a pool;
// the controller deletes the slices it does not need.
func (d *Driver) publishFirst(ctx context.Context, res resourceslice.DriverResources) (created int) {
	logger := klog.FromContext(ctx)
	pool, ok := res.Pools[d.cfg.NodeName]
	if !ok || len(res.Pools) != 1 {
		return 0
	}
	client := draclient.New(d.cfg.KubeClient)
	existing, err := client.ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{
			resourceapi.ResourceSliceSelectorDriver:   d.cfg.DriverName,
			resourceapi.ResourceSliceSelectorNodeName: d.cfg.NodeName,
		}.String(),
	})
	switch {
	case err != nil:
		logger.V(2).Info("Leaving the first publication to the ResourceSlice controller: listing slices failed", "err", err)
		return 0
	case len(existing.Items) > 0:
		logger.V(2).Info("Leaving the first publication to the ResourceSlice controller: slices of this node exist", "slices", len(existing.Items))
		return 0
	}
	node, err := d.cfg.KubeClient.CoreV1().Nodes().Get(ctx, d.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		logger.V(2).Info("Leaving the first publication to the ResourceSlice controller: reading the Node failed", "err", err)
		return 0
	}
	for i, slice := range firstSlices(d.cfg.DriverName, node, pool) {
		got, err := client.ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
		if err != nil {
			logger.V(2).Info("Leaving the rest of the first publication to the ResourceSlice controller: creating a slice failed", "sliceIndex", i, "err", err)
			return created
		}
		created++
		dropped := &resourceslice.DroppedFieldsError{PoolName: d.cfg.NodeName, SliceIndex: i, DesiredSlice: slice, ActualSlice: got}
		if len(dropped.DisabledFeatures()) > 0 {
			d.HandleError(ctx, dropped, "create ResourceSlice")
			return created
		}
	}
	logger.V(2).Info("Published the node's ResourceSlices ahead of the ResourceSlice controller", "slices", created)
	return created
}

// firstSlices are the slices the ResourceSlice controller
// (k8s.io/dynamic-resource-allocation v0.37 resourceslice, syncPool)
// creates for a pool of a Node owner that has none yet: generation 1 (or
// the pool's, if higher), names generated from the slice's index in hex,
// at least five digits, then driver and node, an owner reference to the
// Node, and taints' TimeAdded rounded to the second.
func firstSlices(driverName string, node *corev1.Node, pool resourceslice.Pool) []*resourceapi.ResourceSlice {
	generation := max(pool.Generation, 1)
	indexLen := max(5, len(strconv.FormatInt(int64(len(pool.Slices)-1), 16)))
	out := make([]*resourceapi.ResourceSlice, 0, len(pool.Slices))
	for i, s := range pool.Slices {
		s = *s.DeepCopy()
		for _, dev := range s.Devices {
			for j := range dev.Taints {
				if t := dev.Taints[j].TimeAdded; t != nil {
					t.Time = t.Time.Round(time.Second)
				}
			}
		}
		var allNodes *bool
		if pool.AllNodes {
			allNodes = ptr.To(true)
		}
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: fmt.Sprintf("%0*x-%s-%s-", indexLen, i, driverName, node.Name),
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr.To(true),
				}},
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:                 driverName,
				Pool:                   resourceapi.ResourcePool{Name: node.Name, Generation: generation, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:               ptr.To(node.Name),
				NodeSelector:           pool.NodeSelector,
				AllNodes:               allNodes,
				Devices:                s.Devices,
				SharedCounters:         s.SharedCounters,
				PerDeviceNodeSelection: s.PerDeviceNodeSelection,
				PartitionTypeAttribute: s.PartitionTypeAttribute,
				SkipNodeOperations:     s.SkipNodeOperations,
			},
		})
	}
	return out
}
