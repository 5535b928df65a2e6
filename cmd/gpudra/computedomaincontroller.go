package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
)

type cdControllerOptions struct {
	api           apiFlags
	maxChannels   int
	resync        time.Duration
	cliqueNS      string
	channelDriver string
	leaderElect   bool
	leaseName     string
	leaseNS       string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
	logging       *logsapi.LoggingConfiguration
}

func newComputeDomainControllerCommand() *cobra.Command {
	o := &cdControllerOptions{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:   "compute-domain-controller",
		Short: "Run the ComputeDomain controller: claim templates, IMEX channels, finalizers and status of ComputeDomains",
		Long: `Run the controller of ComputeDomains (computedomains.resource.nvidia.com).
Per domain it assigns an IMEX channel (status.channel, unique among live
domains), creates the ResourceClaimTemplate named by
spec.channel.resourceClaimTemplate.name, and on deletion removes what it
created. Run one per cluster; replicas elect a leader through a Lease.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	o.api.addFlags(cmd)
	fs.IntVar(&o.maxChannels, "max-channels", imexchannel.DefaultMaxChannels, "IMEX channels handed out to domains, 0..N-1: the nodes' channel count (NVreg_ImexChannelCount); at most this many domains live at once")
	fs.DurationVar(&o.resync, "resync-interval", 5*time.Minute, "how often every ComputeDomain is reconciled again")
	fs.StringVar(&o.cliqueNS, "clique-namespace", os.Getenv("POD_NAMESPACE"), "the driver's namespace, where nodes report their IMEX daemons in ComputeDomainCliques; the domains' status.nodes are derived from them (env POD_NAMESPACE); empty: no status.nodes")
	fs.StringVar(&o.channelDriver, "channel-driver-name", "compute-domain.nvidia.com", "the channel driver, whose ResourceSlices tell each NVLink clique's size: a domain whose spec.numNodes exceeds the largest gets FitsInClique=False; empty: not checked")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader among replicas through a Lease; false runs the controller at once (one replica only)")
	fs.StringVar(&o.leaseName, "leader-election-id", "gpudra-compute-domain-controller", "name of the leader-election Lease")
	fs.StringVar(&o.leaseNS, "leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader-election Lease (env POD_NAMESPACE; default kube-system)")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a leader's lease lasts without renewal")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives up leading")
	fs.DurationVar(&o.retryPeriod, "leader-election-retry-period", 2*time.Second, "how often candidates try to take the lease")
	logsapi.AddFlags(o.logging, fs)
	return cmd
}

func (o *cdControllerOptions) run(ctx context.Context) error {
	if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
		return err
	}
	if o.maxChannels <= 0 {
		return fmt.Errorf("--max-channels %d: must be above zero", o.maxChannels)
	}
	if o.leaseNS == "" {
		o.leaseNS = metav1.NamespaceSystem
	}
	kube, dyn, _, err := o.api.clients("compute-domain-controller")
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	run := func(ctx context.Context) error {
		return computedomain.NewController(computedomain.ControllerConfig{
			KubeClient: kube, DynamicClient: dyn, MaxChannels: o.maxChannels, Resync: o.resync, CliqueNamespace: o.cliqueNS, ChannelDriver: o.channelDriver,
		}).Run(ctx)
	}
	if !o.leaderElect {
		return run(ctx)
	}
	id, _ := os.Hostname()
	id += "_" + string(uuid.NewUUID())
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.leaseNS, o.leaseName, kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	runErr := make(chan error, 1)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   o.leaseDuration,
		RenewDeadline:   o.renewDeadline,
		RetryPeriod:     o.retryPeriod,
		ReleaseOnCancel: true,
		Name:            o.leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Leading; starting the ComputeDomain controller", "identity", id)
				runErr <- run(ctx)
			},
			OnStoppedLeading: func() {
				logger.Info("No longer leading", "identity", id)
			},
		},
	})
	select {
	case err := <-runErr:
		if err != nil {
			return err
		}
	default:
	}
	if ctx.Err() == nil {
		// Lost the lease while the process goes on: exit, so that a
		// restart competes again with a fresh controller (its channel
		// assigner seeded from the API server, not from memory).
		return fmt.Errorf("lost the leader-election lease %s/%s", o.leaseNS, o.leaseName)
	}
	return nil
}
