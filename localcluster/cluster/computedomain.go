package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/deployments/crds"
	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/plugin"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ComputeDomains is the ComputeDomain stack of a local cluster: the CRDs,
// the DeviceClasses, the controller in process and a channel plugin on
// every node.
type ComputeDomains struct {
	cancel  context.CancelFunc
	done    chan error
	plugins []*plugin.Driver
}

// StartComputeDomains installs the ComputeDomain CRDs and DeviceClasses,
// starts the controller (maxChannels channels; 0 means the default) and
// the channel plugin on every node. Stop it before the cluster.
func (c *Cluster) StartComputeDomains(ctx context.Context, maxChannels int) (_ *ComputeDomains, finalErr error) {
	if maxChannels <= 0 {
		maxChannels = imexchannel.DefaultMaxChannels
	}
	for _, name := range []string{"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"} {
		data, err := crds.Read(name)
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return nil, fmt.Errorf("CRD %s: %w", name, err)
		}
		if _, err := c.dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("install CRD %s: %w", name, err)
		}
	}
	// Served once a List works; then the mapper must learn the new kinds.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.dyn.Resource(computedomain.GVR).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ComputeDomain CRD not served: %w", err)
	}
	c.mapper.Reset()
	classes, err := deviceclasses.ComputeDomain()
	if err != nil {
		return nil, err
	}
	for _, class := range classes {
		if _, err := c.client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("install DeviceClass %s: %w", class.Name, err)
		}
	}

	runCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.FromContext(ctx)))
	cds := &ComputeDomains{cancel: cancel, done: make(chan error, 1)}
	defer func() {
		if finalErr != nil {
			cds.Stop()
		}
	}()
	ctrl := computedomain.NewController(computedomain.ControllerConfig{KubeClient: c.client, DynamicClient: c.dyn, MaxChannels: maxChannels, CliqueNamespace: "gpudra"})
	go func() { cds.done <- ctrl.Run(runCtx) }()

	// The plugins read domains with the admin client: the chart's RBAC
	// for the channel plugin is still to be written.
	channels := &computedomain.APIChannels{Client: c.dyn}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() {
			d, err := n.StartComputeDomainPlugin(ctx, c.client, channels)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			cds.plugins = append(cds.plugins, d)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cds, nil
}

// Stop stops the channel plugins and the controller.
func (s *ComputeDomains) Stop() {
	for _, d := range s.plugins {
		d.Stop()
	}
	s.plugins = nil
	if s.cancel != nil {
		s.cancel()
		if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
			klog.Background().Error(err, "ComputeDomain controller stopped")
		}
		s.cancel = nil
	}
}

// Dynamic returns the admin's dynamic client, for custom resources such
// as ComputeDomains.
func (c *Cluster) Dynamic() dynamic.Interface { return c.dyn }
