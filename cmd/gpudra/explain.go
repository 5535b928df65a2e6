package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpudra/gpudra/pkg/explain"
)

type explainOptions struct {
	kubeconfig string
	namespace  string
	output     string
}

func newExplainCommand() *cobra.Command {
	o := &explainOptions{}
	cmd := &cobra.Command{
		Use:   "explain (pod/NAME | resourceclaim/NAME | NAME)",
		Short: "Explain why a pending pod's or claim's devices cannot be allocated",
		Long: `Explain why a pending pod's or claim's devices cannot be allocated, or where
they would go.

explain reads the pod (a bare NAME is a pod), its ResourceClaims (or, for
claims not created yet, their ResourceClaimTemplates), the cluster's
ResourceSlices, DeviceClasses, Nodes and the other claims' allocations, and
runs the scheduler's own allocator on every node. When no node fits, each
request (and each subrequest of a firstAvailable list) is tried alone and
its DeviceClass and selectors are evaluated clause by clause: the report
names the request that fails and why (too few devices on any one node, a
selector no device passes with the nearest device, capacity, devices other
claims hold, a constraint). It only reads (get and list); any cluster and
any DRA driver will do.`,
		Example: `  gpudra explain -n ml train-0
  gpudra explain resourceclaim/big-gpus -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), args[0])
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster config)")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the pod or claim (default: the kubeconfig context's, else default)")
	fs.StringVarP(&o.output, "output", "o", explain.Formats[0], "output format: "+strings.Join(explain.Formats, "|"))
	return cmd
}

func (o *explainOptions) run(ctx context.Context, out io.Writer, arg string) error {
	if !slices.Contains(explain.Formats, o.output) {
		return fmt.Errorf("--output %q: supported values: %s", o.output, strings.Join(explain.Formats, ", "))
	}
	kind, name, err := explain.ParseTarget(arg)
	if err != nil {
		return err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	namespace := o.namespace
	if namespace == "" {
		if namespace, _, err = config.Namespace(); err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
	}
	restConfig, err := config.ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	return explainTo(ctx, out, client, explain.Target{Kind: kind, Namespace: namespace, Name: name}, o.output)
}

// explainTo explains the target and writes the report.
func explainTo(ctx context.Context, out io.Writer, client kubernetes.Interface, target explain.Target, format string) error {
	rep, err := explain.Explain(ctx, client, target)
	if err != nil {
		return err
	}
	return explain.Write(out, format, rep)
}
