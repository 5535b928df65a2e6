package controlplane

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// scheduler is a running kube-scheduler.
type scheduler struct {
	cancel   context.CancelFunc
	done     <-chan struct{}
	shutdown func()
}

// startScheduler runs kube-scheduler with its default profile (which
// includes the DynamicResources plugin) against the API server described
// by kubeconfig. It serves no HTTPS endpoint and does not elect a leader.
func startScheduler(ctx context.Context, kubeconfig string, qps float32, burst int) (*scheduler, error) {
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	effectiveVersion := compatibility.DefaultBuildEffectiveVersion()
	effectiveVersion.SetEmulationVersion(featureGate.EmulationVersion())
	effectiveVersion.SetMinCompatibilityVersion(featureGate.MinCompatibilityVersion())
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, effectiveVersion, featureGate); err != nil {
		return nil, err
	}
	opts := options.NewOptionsWithComponentGlobalsRegistry(registry)
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		fmt.Sprintf("--kube-api-qps=%g", qps),
		fmt.Sprintf("--kube-api-burst=%d", burst),
	}); err != nil {
		return nil, fmt.Errorf("kube-scheduler flags: %w", err)
	}
	if err := registry.Set(); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	cc, sched, err := app.Setup(ctx, opts)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("set up kube-scheduler: %w", err)
	}
	// What app.Run does, minus the configz registration (one per process,
	// which would keep two local clusters from running side by side),
	// health endpoints and leader election: record events, sync the
	// informers, then schedule until ctx ends.
	cc.EventBroadcaster.StartRecordingToSink(ctx.Done())
	cc.InformerFactory.Start(ctx.Done())
	if cc.DynInformerFactory != nil {
		cc.DynInformerFactory.Start(ctx.Done())
	}
	cc.InformerFactory.WaitForCacheSync(ctx.Done())
	if cc.DynInformerFactory != nil {
		cc.DynInformerFactory.WaitForCacheSync(ctx.Done())
	}
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		cancel()
		cc.EventBroadcaster.Shutdown()
		return nil, fmt.Errorf("kube-scheduler handlers not synced: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sched.Run(ctx)
	}()
	return &scheduler{cancel: cancel, done: done, shutdown: func() {
		cc.InformerFactory.Shutdown()
		if cc.DynInformerFactory != nil {
			cc.DynInformerFactory.Shutdown()
		}
		cc.EventBroadcaster.Shutdown()
	}}, nil
}

func (s *scheduler) stop() {
	s.cancel()
	<-s.done
	s.shutdown()
}
