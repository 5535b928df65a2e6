package controlplane

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	cacheddiscovery "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/daemon"
	"k8s.io/kubernetes/pkg/controller/deployment"
	"k8s.io/kubernetes/pkg/controller/devicetainteviction"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/namespace"
	"k8s.io/kubernetes/pkg/controller/replicaset"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/controller/serviceaccount"
	"k8s.io/kubernetes/pkg/controller/statefulset"
	"k8s.io/kubernetes/pkg/features"
)

// controllers runs the kube-controller-manager controllers that users'
// manifests need, built directly from their packages (the controller
// manager's own wiring would link every other controller too).
type controllers struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	factory informers.SharedInformerFactory
	meta    metadatainformer.SharedInformerFactory
}

// Workers per controller: kube-controller-manager's defaults in v1.37
// (--concurrent-resourceclaim-syncs, --concurrent-namespace-syncs,
// --concurrent-deployment-syncs, --concurrent-replicaset-syncs,
// --concurrent-job-syncs, --concurrent-statefulset-syncs,
// --concurrent-gc-syncs; the ServiceAccount
// controller always runs one). Fewer resource-claim workers than a real
// cluster has made the claims of a burst of pods wait for the controller:
// with 10, the median pod of 800 created at once got its claim 9 s after
// its create, with 50 about 2.5 s.
const (
	resourceClaimWorkers  = 50
	namespaceWorkers      = 10
	deploymentWorkers     = 5
	replicaSetWorkers     = 5
	jobWorkers            = 5
	statefulSetWorkers    = 5
	garbageCollectWorkers = 20
	serviceAccountWorkers = 1
	deviceTaintWorkers    = 8
	daemonSetWorkers      = 2
	rootCAWorkers         = 1
)

// Names of the controllers, in the order they start; the daemonset
// controller only with Options.DaemonSets, the device-taint-eviction
// controller only where DRADeviceTaints is on (as
// kube-controller-manager starts it: before 1.36 the gate is off, and the
// DeviceTaintRule API it watches is not served).
var controllerNames = []string{"resource-claim", "namespace", "deployment", "replicaset", "job", "statefulset", "garbage-collector", "serviceaccount", deviceTaintController, "root-ca-certificate-publisher"}

const (
	daemonSetController   = "daemonset"
	deviceTaintController = "device-taint-eviction"
)

// Controllers returns the names of the controllers the control plane
// runs, as kube-controller-manager's --controllers names them. Workloads
// of other kinds (CronJobs, ReplicationControllers, and DaemonSets
// without Options.DaemonSets) are stored but nothing acts on them.
func (c *ControlPlane) Controllers() []string {
	names := slices.Clone(controllerNames)
	if !FeatureEnabled(string(features.DRADeviceTaints)) {
		names = slices.DeleteFunc(names, func(n string) bool { return n == deviceTaintController })
	}
	if c.opts.DaemonSets {
		names = append(names, daemonSetController)
	}
	return names
}

// startControllers starts the controllers; rootCA is the authority of the
// API server's serving certificate, which the root-ca-certificate-publisher
// publishes as the kube-root-ca.crt ConfigMap of every namespace: a real
// kubelet mounts it into pods (the ServiceAccount token's ca.crt) and
// waits for it before it starts their containers.
// names are the controllers to run (ControlPlane.Controllers).
func startControllers(ctx context.Context, base *rest.Config, qps float32, burst int, rootCA []byte, names []string) (_ *controllers, finalErr error) {
	logger := klog.FromContext(ctx).WithName("controller-manager")
	ctx = klog.NewContext(ctx, logger)
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = qps, burst
	cfg.UserAgent = "localcluster-controller-manager"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	metaClient, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	discoveryClient, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	c := &controllers{
		cancel:  cancel,
		factory: informers.NewSharedInformerFactory(client, 0),
		meta:    metadatainformer.NewSharedInformerFactory(metaClient, 0),
	}
	defer func() {
		if finalErr != nil {
			c.stop()
		}
	}()
	f := c.factory
	var runs []func(context.Context)

	claims, err := resourceclaim.NewController(logger, client, f.Core().V1().Pods(), f.Scheduling().V1beta1().PodGroups(),
		f.Resource().V1().ResourceClaims(), f.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		return nil, fmt.Errorf("resource-claim controller: %w", err)
	}
	runs = append(runs, func(ctx context.Context) { claims.Run(ctx, resourceClaimWorkers) })

	ns := namespace.NewNamespaceController(ctx, client, metaClient, client.Discovery().ServerPreferredNamespacedResources,
		f.Core().V1().Namespaces(), 5*time.Minute, corev1.FinalizerKubernetes)
	runs = append(runs, func(ctx context.Context) { ns.Run(ctx, namespaceWorkers) })

	dc, err := deployment.NewDeploymentController(ctx, f.Apps().V1().Deployments(), f.Apps().V1().ReplicaSets(), f.Core().V1().Pods(), client)
	if err != nil {
		return nil, fmt.Errorf("deployment controller: %w", err)
	}
	runs = append(runs, func(ctx context.Context) { dc.Run(ctx, deploymentWorkers) })

	rsc := replicaset.NewReplicaSetController(ctx, f.Apps().V1().ReplicaSets(), f.Core().V1().Pods(), client, replicaset.BurstReplicas)
	runs = append(runs, func(ctx context.Context) { rsc.Run(ctx, replicaSetWorkers) })

	jc, err := job.NewController(ctx, client, f.Core().V1().Pods(), f.Batch().V1().Jobs(), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("job controller: %w", err)
	}
	runs = append(runs, func(ctx context.Context) { jc.Run(ctx, jobWorkers) })

	ssc := statefulset.NewStatefulSetController(ctx, f.Core().V1().Pods(), f.Apps().V1().StatefulSets(),
		f.Core().V1().PersistentVolumeClaims(), f.Apps().V1().ControllerRevisions(), client)
	runs = append(runs, func(ctx context.Context) { ssc.Run(ctx, statefulSetWorkers) })

	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cacheddiscovery.NewMemCacheClient(discoveryClient))
	informersStarted := make(chan struct{})
	ignored := map[schema.GroupResource]struct{}{{Group: "", Resource: "events"}: {}, {Group: "events.k8s.io", Resource: "events"}: {}}
	gc, err := garbagecollector.NewGarbageCollector(ctx, client, metaClient, mapper, ignored,
		informerfactory.NewInformerFactory(f, c.meta), informersStarted)
	if err != nil {
		return nil, fmt.Errorf("garbage collector: %w", err)
	}
	runs = append(runs,
		func(ctx context.Context) { gc.Run(ctx, garbageCollectWorkers, 30*time.Second) },
		func(ctx context.Context) { gc.Sync(ctx, discoveryClient, 30*time.Second) },
		func(ctx context.Context) {
			wait.UntilWithContext(ctx, func(context.Context) { mapper.Reset() }, 30*time.Second)
		},
	)

	sac, err := serviceaccount.NewServiceAccountsController(logger, f.Core().V1().ServiceAccounts(), f.Core().V1().Namespaces(),
		client, serviceaccount.DefaultServiceAccountsControllerOptions())
	if err != nil {
		return nil, fmt.Errorf("serviceaccount controller: %w", err)
	}
	runs = append(runs, func(ctx context.Context) { sac.Run(ctx, serviceAccountWorkers) })

	// Evicts the pods using a device with a NoExecute taint (a lost GPU),
	// as kube-controller-manager's device-taint-eviction controller does.
	if slices.Contains(names, deviceTaintController) {
		dte := devicetainteviction.New(client, f.Core().V1().Pods(), f.Resource().V1().ResourceClaims(), f.Resource().V1().ResourceSlices(),
			f.Resource().V1().DeviceTaintRules(), f.Resource().V1().DeviceClasses(), "device-taint-eviction-controller")
		runs = append(runs, func(ctx context.Context) {
			if err := dte.Run(ctx, deviceTaintWorkers); err != nil {
				klog.FromContext(ctx).Error(err, "Device taint eviction stopped")
			}
		})
	}

	if slices.Contains(names, daemonSetController) {
		dsc, err := daemon.NewDaemonSetsController(ctx, f.Apps().V1().DaemonSets(), f.Apps().V1().ControllerRevisions(),
			f.Core().V1().Pods(), f.Core().V1().Nodes(), client, flowcontrol.NewBackOff(time.Second, 15*time.Minute))
		if err != nil {
			return nil, fmt.Errorf("daemonset controller: %w", err)
		}
		runs = append(runs, func(ctx context.Context) { dsc.Run(ctx, daemonSetWorkers) })
	}

	publisher, err := rootcacertpublisher.NewPublisher(f.Core().V1().ConfigMaps(), f.Core().V1().Namespaces(), client, rootCA)
	if err != nil {
		return nil, fmt.Errorf("root-ca-certificate-publisher: %w", err)
	}
	runs = append(runs, func(ctx context.Context) { publisher.Run(ctx, rootCAWorkers) })

	f.Start(ctx.Done())
	c.meta.Start(ctx.Done())
	close(informersStarted)
	for _, run := range runs {
		c.wg.Go(func() { run(ctx) })
	}
	return c, nil
}

func (c *controllers) stop() {
	c.cancel()
	c.wg.Wait()
	c.factory.Shutdown()
	c.meta.Shutdown()
}
