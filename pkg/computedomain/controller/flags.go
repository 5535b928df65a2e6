package controller

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/kubeclient"
)

// DefaultLeaseName is the leader-election Lease's name unless
// --leader-election-id says otherwise.
const DefaultLeaseName = "gpudra-compute-domain-controller"

// Flags are the flags of `gpudra compute-domain-controller`. The
// binary parses its command line with them, and the local cluster parses
// the Helm chart's controller container arguments with the same flag set.
type Flags struct {
	kubeclient.Flags
	MaxChannels     int
	Resync          time.Duration
	CliqueNamespace string
	ChannelDriver   string
	LeaderElect     bool
	LeaseName       string
	LeaseNamespace  string
	LeaseDuration   time.Duration
	RenewDeadline   time.Duration
	RetryPeriod     time.Duration
	Logging         *logsapi.LoggingConfiguration
}

// NewFlags returns the flags' holder with its logging
// configuration.
func NewFlags() *Flags {
	return &Flags{Logging: logsapi.NewLoggingConfiguration()}
}

// ParseFlags parses args (the flags after `gpudra
// compute-domain-controller`) with the command's flag set.
func ParseFlags(args []string) (*Flags, error) {
	o := NewFlags()
	fs := pflag.NewFlagSet("compute-domain-controller", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("compute-domain-controller %s: %w", strings.Join(args, " "), err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("compute-domain-controller: unexpected arguments %q", fs.Args())
	}
	return o, nil
}

// AddFlags adds every flag of `gpudra compute-domain-controller` to fs.
func (o *Flags) AddFlags(fs *pflag.FlagSet) {
	o.Flags.AddFlags(fs)
	fs.IntVar(&o.MaxChannels, "max-channels", imexchannel.DefaultMaxChannels, "IMEX channels handed out to domains, 0..N-1: the nodes' channel count (NVreg_ImexChannelCount); at most this many domains live at once")
	fs.DurationVar(&o.Resync, "resync-interval", 5*time.Minute, "how often every ComputeDomain is reconciled again")
	fs.StringVar(&o.CliqueNamespace, "clique-namespace", os.Getenv("POD_NAMESPACE"), "the driver's namespace, where nodes report their IMEX daemons in ComputeDomainCliques; the domains' status.nodes are derived from them (env POD_NAMESPACE); empty: no status.nodes")
	fs.StringVar(&o.ChannelDriver, "channel-driver-name", computedomain.DriverName, "the channel driver, whose ResourceSlices tell each NVLink clique's size: a domain whose spec.numNodes exceeds the largest gets FitsInClique=False; empty: not checked")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader among replicas through a Lease; false runs the controller at once (one replica only)")
	fs.StringVar(&o.LeaseName, "leader-election-id", DefaultLeaseName, "name of the leader-election Lease")
	fs.StringVar(&o.LeaseNamespace, "leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader-election Lease (env POD_NAMESPACE; default kube-system)")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a leader's lease lasts without renewal")
	fs.DurationVar(&o.RenewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives up leading")
	fs.DurationVar(&o.RetryPeriod, "leader-election-retry-period", 2*time.Second, "how often candidates try to take the lease")
	logsapi.AddFlags(o.Logging, fs)
}

// Validate checks the flags and fills in the Lease's default namespace.
func (o *Flags) Validate() error {
	if o.MaxChannels <= 0 {
		return fmt.Errorf("--max-channels %d: must be above zero", o.MaxChannels)
	}
	if err := o.Flags.Validate(); err != nil {
		return err
	}
	if o.LeaderElect {
		if o.LeaseName == "" {
			return fmt.Errorf("--leader-election-id is empty: name the Lease")
		}
		// What client-go's leader election requires (it panics otherwise).
		if !(o.RetryPeriod > 0 && float64(o.RenewDeadline) > leaderelection.JitterFactor*float64(o.RetryPeriod) && o.RenewDeadline < o.LeaseDuration) {
			return fmt.Errorf("--leader-election-retry-period %v, --leader-election-renew-deadline %v, --leader-election-lease-duration %v: the renew deadline must be over %v times the retry period and under the lease duration", o.RetryPeriod, o.RenewDeadline, o.LeaseDuration, leaderelection.JitterFactor)
		}
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = metav1.NamespaceSystem
	}
	return nil
}

// Run validates the flags and runs the controller with the clients until
// ctx ends: at once without leader election, otherwise while this process
// (identity) holds the Lease. Losing the Lease while ctx goes on is an
// error, so that the process exits and a restart competes again with a
// fresh controller (its channel assigner seeded from the API server, not
// from memory).
func (o *Flags) Run(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, identity string) error {
	if err := o.Validate(); err != nil {
		return err
	}
	run := func(ctx context.Context) error {
		return New(Config{
			KubeClient: kube, DynamicClient: dyn, MaxChannels: o.MaxChannels, Resync: o.Resync, CliqueNamespace: o.CliqueNamespace, ChannelDriver: o.ChannelDriver,
		}).Run(ctx)
	}
	if !o.LeaderElect {
		return run(ctx)
	}
	logger := klog.FromContext(ctx)
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.LeaseNamespace, o.LeaseName, kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: identity})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	runErr := make(chan error, 1)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            o.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Leading; starting the ComputeDomain controller", "identity", identity)
				runErr <- run(ctx)
			},
			OnStoppedLeading: func() {
				logger.Info("No longer leading", "identity", identity)
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
		return fmt.Errorf("lost the leader-election lease %s/%s", o.LeaseNamespace, o.LeaseName)
	}
	return nil
}
