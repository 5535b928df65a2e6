package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/webhook"

	"github.com/gpudra/gpudra/localcluster/install"
)

// installChart renders gpudra's chart with the cluster's values, applies
// every object but the workloads, and starts the webhook's pod; the
// DaemonSet's pods start with the nodes.
func (c *Cluster) installChart(ctx context.Context, progress func(string)) error {
	values := maps.Clone(c.opts.ChartValues)
	if values == nil {
		values = map[string]any{}
	}
	if cd, _ := values["computeDomains"].(map[string]any); cd == nil || cd["enabled"] == nil {
		// The chart turns the driver on by default; the local cluster
		// runs it where the fleet has a clique, or when asked.
		cd = maps.Clone(cd)
		if cd == nil {
			cd = map[string]any{}
		}
		cd["enabled"] = c.computeDomainsEnabled()
		values["computeDomains"] = cd
	}
	values = c.imexChartValues(values)
	if _, ok := values["driverName"]; !ok {
		values["driverName"] = c.opts.DriverName
	} else if values["driverName"] != c.opts.DriverName {
		return fmt.Errorf("chart value driverName %v: the cluster's driver name is %s", values["driverName"], c.opts.DriverName)
	}
	r, err := install.Render(install.Options{Values: values, Namespace: c.opts.ChartNamespace, KubeVersion: "v" + c.cp.KubernetesMinor() + ".0"})
	if err != nil {
		return err
	}
	c.chartValues = values
	if c.opts.BeforeChart != nil {
		if err := c.opts.BeforeChart(r); err != nil {
			return err
		}
	}
	n, err := r.Apply(ctx, c.Apply)
	if err != nil {
		return err
	}
	c.release = r
	if r.Webhook != nil {
		start := time.Now()
		if c.webhook, err = c.startWebhook(ctx, r); err != nil {
			return err
		}
		progress(fmt.Sprintf("%-24s ready in %v", "webhook pod", time.Since(start).Round(time.Millisecond)))
	}
	progress(fmt.Sprintf("installed gpudra from the chart %s (release %s, namespace %s): %d objects", install.ChartPath, r.Name, r.Namespace, n))
	return nil
}

// Release returns the chart as installed.
func (c *Cluster) Release() *install.Release { return c.release }

// serviceAccountIdentity is who a pod's projected ServiceAccount token
// authenticates as; node, if not empty, is the node its token is bound to
// (the token's node-name extra).
func serviceAccountIdentity(namespace, name, node string) rest.ImpersonationConfig {
	id := rest.ImpersonationConfig{
		UserName: serviceaccount.MakeUsername(namespace, name),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	if node != "" {
		id.Extra = map[string][]string{serviceaccount.NodeNameKey: {node}}
	}
	return id
}

// nodeVolumes returns where the kubelet plugin pod's volumes live on a
// simulated node: the kubelet's plugin directories and the CDI directory
// (the chart's volumes plugins, plugins-registry and cdi) and the IMEX
// hosts file (imex-hosts, simnode's Node.IMEXHostsFile) are the node's;
// every other host path (driver root, /sys, /proc, the MPS root,
// /lib/modules) becomes a directory of the node's own that nothing reads,
// since the simulated node supplies hardware, VFIO sysfs and MPS itself.
func nodeVolumes(nodeDir, driverName string) func(corev1.Volume) (string, error) {
	return func(v corev1.Volume) (string, error) {
		if v.HostPath == nil {
			return "", fmt.Errorf("the local cluster maps only hostPath volumes of the kubelet plugin's pod")
		}
		switch v.Name {
		case "plugins":
			return filepath.Join(nodeDir, "plugins"), nil
		case "plugins-registry":
			return filepath.Join(nodeDir, "plugins_registry"), nil
		case "cdi":
			return filepath.Join(nodeDir, "cdi"), nil
		case imexHostsVolume:
			return filepath.Join(nodeDir, "hosts"), nil
		default:
			return filepath.Join(nodeDir, "host", v.Name), nil
		}
	}
}

// webhookPod is the webhook Deployment's pod, running in this process.
type webhookPod struct {
	cancel  context.CancelFunc
	done    chan error
	unroute func()
}

// startWebhook runs `gpudra webhook` with the arguments of the chart's
// Deployment, as its ServiceAccount, on a loopback port that the API
// server reaches through the chart's Service (see
// controlplane.RouteService), and waits until the API server calls it.
func (c *Cluster) startWebhook(ctx context.Context, r *install.Release) (*webhookPod, error) {
	pod := r.Webhook
	podDir := filepath.Join(c.dir, "webhook-"+string(uuid.NewUUID())[:8])
	args, err := pod.Args(install.Instance{UID: string(uuid.NewUUID()), Volume: func(v corev1.Volume) (string, error) {
		if v.EmptyDir == nil {
			return "", errors.New("the local cluster runs the webhook with emptyDir volumes only (webhook.tls.mode selfSigned)")
		}
		dir := filepath.Join(podDir, v.Name)
		return dir, os.MkdirAll(dir, 0o700)
	}})
	if err != nil {
		return nil, err
	}
	if len(args) == 0 || args[0] != "webhook" {
		return nil, fmt.Errorf("%s: command line %q: want gpudra webhook", pod.Owner, args)
	}
	flags, err := webhook.ParseFlags(args[1:])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pod.Owner, err)
	}
	cfg, err := flags.Config()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pod.Owner, err)
	}
	if cfg.SelfSignedDir != "" && cfg.WebhookConfigName != "" {
		rc := c.cp.RESTConfig("gpudra-webhook", 5, 10)
		rc.Impersonate = serviceAccountIdentity(pod.Namespace, pod.ServiceAccount(), "")
		if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, err
		}
	}
	svcPort, err := servicePortFor(r.WebhookService, pod.Container, flags.Port)
	if err != nil {
		return nil, err
	}
	// The pod's IP is loopback; its port is any free one, which the
	// Service's route names.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithName("webhook")
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	w := &webhookPod{cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- webhook.Run(runCtx, l, cfg) }()
	w.unroute = c.cp.RouteService(r.WebhookService.Namespace, r.WebhookService.Name, svcPort, l.Addr().String())
	if err := c.waitForWebhook(ctx, w); err != nil {
		_ = w.stop()
		return nil, fmt.Errorf("%s: %w", pod.Owner, err)
	}
	return w, nil
}

// servicePortFor returns the port of svc that targets the container's
// port (by name or number) that the webhook listens on.
func servicePortFor(svc *corev1.Service, container corev1.Container, port int) (int32, error) {
	var names []string
	for _, p := range container.Ports {
		if int(p.ContainerPort) == port && p.Name != "" {
			names = append(names, p.Name)
		}
	}
	for _, sp := range svc.Spec.Ports {
		switch sp.TargetPort.Type {
		case intstr.Int:
			if sp.TargetPort.IntValue() == port || (sp.TargetPort.IntValue() == 0 && int(sp.Port) == port) {
				return sp.Port, nil
			}
		case intstr.String:
			for _, n := range names {
				if sp.TargetPort.StrVal == n {
					return sp.Port, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("service %s/%s has no port that targets the webhook's port %d", svc.Namespace, svc.Name, port)
}

// waitForWebhook waits until the API server calls the webhook: a dry run
// of a claim with a config the webhook refuses is refused by it.
func (c *Cluster) waitForWebhook(ctx context.Context, w *webhookPod) error {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "gpudra-sim-webhook-probe"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     c.opts.DriverName,
				Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "probe": true}`)},
			}}}},
		}},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-w.done:
			w.done <- err
			return false, fmt.Errorf("the webhook stopped: %w", err)
		default:
		}
		_, last = c.client.ResourceV1().ResourceClaims(metav1.NamespaceDefault).Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), "admission webhook ") && strings.Contains(last.Error(), "denied the request"), nil
	})
	if err != nil {
		return fmt.Errorf("the API server never called the webhook (last answer: %v): %w", last, err)
	}
	return nil
}

func (w *webhookPod) stop() error {
	w.unroute()
	w.cancel()
	return <-w.done
}

// computeDomainsEnabled reports whether the chart's ComputeDomain driver
// runs: as the chart values' computeDomains.enabled says, or, where they do
// not set it, when a node of the fleet is in a clique or the options ask
// for it.
func (c *Cluster) computeDomainsEnabled() bool {
	if cd, _ := c.opts.ChartValues["computeDomains"].(map[string]any); cd != nil && cd["enabled"] != nil {
		enabled, _ := cd["enabled"].(bool)
		return enabled
	}
	return c.opts.ComputeDomains || fleetHasClique(c.opts.Fleet)
}
