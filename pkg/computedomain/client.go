package computedomain

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// DriverName is the channel driver's name.
const DriverName = v1beta1.ComputeDomainDriverName

// GVR is the ComputeDomain resource.
var GVR = schema.GroupVersionResource{Group: v1beta1.GroupName, Version: v1beta1.Version, Resource: v1beta1.ComputeDomainResource}

// CliqueGVR is the ComputeDomainClique resource.
var CliqueGVR = schema.GroupVersionResource{Group: v1beta1.GroupName, Version: v1beta1.Version, Resource: v1beta1.ComputeDomainCliqueResource}

// CliqueName is the name of a domain's clique object.
func CliqueName(domainUID, cliqueID string) string { return domainUID + "." + cliqueID }

// FromUnstructured converts an object the dynamic client returned.
func FromUnstructured(u *unstructured.Unstructured) (*v1beta1.ComputeDomain, error) {
	cd := &v1beta1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), cd); err != nil {
		return nil, fmt.Errorf("ComputeDomain %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return cd, nil
}

// ErrNoChannel is returned while a domain has no channel yet: the
// controller has not seen it, or is not running. Prepare fails and the
// kubelet retries.
var ErrNoChannel = errors.New("the ComputeDomain has no IMEX channel yet (status.channel is unset): is the compute-domain-controller running?")

// APIChannels reads domains' channels from the API server. It implements
// imexchannel.Channels.
type APIChannels struct {
	Client dynamic.Interface
}

// Channel returns status.channel of the ComputeDomain with UID domainID in
// namespace. A domain of another namespace is not found: a claim joins
// only a domain of its own namespace.
func (c *APIChannels) Channel(ctx context.Context, namespace, domainID string) (int, error) {
	list, err := c.Client.Resource(GVR).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list ComputeDomains in namespace %s: %w", namespace, err)
	}
	for i := range list.Items {
		if string(list.Items[i].GetUID()) != domainID {
			continue
		}
		cd, err := FromUnstructured(&list.Items[i])
		if err != nil {
			return 0, err
		}
		if cd.DeletionTimestamp != nil {
			return 0, fmt.Errorf("ComputeDomain %s/%s is being deleted", namespace, cd.Name)
		}
		if cd.Status.Channel == nil {
			return 0, fmt.Errorf("ComputeDomain %s/%s: %w", namespace, cd.Name, ErrNoChannel)
		}
		return int(*cd.Status.Channel), nil
	}
	return 0, fmt.Errorf("no ComputeDomain with this UID in namespace %s (a claim joins only a domain of its own namespace)", namespace)
}
