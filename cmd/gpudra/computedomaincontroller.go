package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"

	cdcontroller "github.com/gpudra/gpudra/pkg/computedomain/controller"
)

// newComputeDomainControllerCommand runs the controller; package
// computedomain holds its flags so that the local cluster parses the Helm
// chart's arguments with the same flag set.
func newComputeDomainControllerCommand() *cobra.Command {
	o := cdcontroller.NewFlags()
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
			if err := logsapi.ValidateAndApply(o.Logging, nil); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			cfg, err := o.RESTConfig("compute-domain-controller")
			if err != nil {
				return err
			}
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return err
			}
			id, _ := os.Hostname()
			id += "_" + string(uuid.NewUUID())
			if err := o.Run(cmd.Context(), kube, dyn, id); err != nil {
				return fmt.Errorf("compute-domain-controller: %w", err)
			}
			return nil
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
