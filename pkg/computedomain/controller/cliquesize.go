package controller

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// Condition and reasons of a domain's fit in one NVLink clique.
const (
	// ConditionFitsInClique is False when spec.numNodes is larger than
	// the largest clique: an IMEX domain spans one clique, so such a
	// domain can never become Ready.
	ConditionFitsInClique  = "FitsInClique"
	ReasonLargerThanClique = "LargerThanClique"
	ReasonFits             = "Fits"
)

// cliqueSizes counts the nodes of each NVLink clique from the channel
// driver's ResourceSlices: every node of a clique publishes channel-0 with
// its cliqueID attribute.
type cliqueSizes struct {
	informer cache.SharedIndexInformer
}

func newCliqueSizes(client kubernetes.Interface, driver string) *cliqueSizes {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver).String()
	}))
	return &cliqueSizes{informer: f.Resource().V1().ResourceSlices().Informer()}
}

// largest returns the largest clique's ID and node count.
func (s *cliqueSizes) largest() (clique string, nodes int) {
	members := map[string]map[string]bool{}
	for _, obj := range s.informer.GetStore().List() {
		sl, ok := obj.(*resourceapi.ResourceSlice)
		if !ok || sl.Spec.NodeName == nil {
			continue
		}
		for _, d := range sl.Spec.Devices {
			a, ok := d.Attributes[devicemodel.AttrCliqueID]
			if !ok || a.StringValue == nil {
				continue
			}
			if members[*a.StringValue] == nil {
				members[*a.StringValue] = map[string]bool{}
			}
			members[*a.StringValue][*sl.Spec.NodeName] = true
		}
	}
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, strings.Compare)
	for _, id := range ids {
		if n := len(members[id]); n > nodes {
			clique, nodes = id, n
		}
	}
	return clique, nodes
}

// fitCondition says whether the domain's spec.numNodes fits in the largest
// clique; ok is false when there is nothing to say (no node count asked).
func (s *cliqueSizes) fitCondition(cd *v1beta1.ComputeDomain) (metav1.Condition, bool) {
	if s == nil || cd.Spec.NumNodes <= 0 {
		return metav1.Condition{}, false
	}
	clique, n := s.largest()
	if cd.Spec.NumNodes > n {
		msg := fmt.Sprintf("spec.numNodes %d is larger than the largest NVLink clique of the cluster (%d nodes", cd.Spec.NumNodes, n)
		if clique != "" {
			msg += ", clique " + clique
		}
		msg += "): an IMEX domain spans one clique, so this domain cannot become Ready; lower spec.numNodes"
		return condition(cd, ConditionFitsInClique, metav1.ConditionFalse, ReasonLargerThanClique, msg), true
	}
	return condition(cd, ConditionFitsInClique, metav1.ConditionTrue, ReasonFits,
		fmt.Sprintf("spec.numNodes %d fits in clique %s (%d nodes)", cd.Spec.NumNodes, clique, n)), true
}

// enqueueAll queues every known domain.
func (c *Controller) enqueueAll() {
	for _, key := range c.informer.GetStore().ListKeys() {
		c.queue.Add(key)
	}
}
