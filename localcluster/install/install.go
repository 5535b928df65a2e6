// Package install installs gpudra into the local cluster from its Helm
// chart (deployments/helm/gpudra), as `helm install` would: the chart is
// rendered with Helm's own library with the values a user would pass (the
// chart's kubeVersion constraint, the values schema, then the templates),
// every rendered object is decoded strictly into its typed Kubernetes
// object, so that a field the API would drop or refuse fails here (see
// [RenderChart]), and every object but the workloads is applied to the API
// server. The workloads (the kubelet plugin's DaemonSet, the webhook's
// Deployment) are not handed to controllers, since the local cluster runs
// no container: their pods run in this process, from the pod templates the
// chart rendered (see [Pod]); so does the compute-domain controller.
package install

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/localcluster/manifests"
)

// ChartPath is the chart's directory in the repository, for messages.
const ChartPath = "deployments/helm/gpudra"

// Options say what to install.
type Options struct {
	// Values are the user's values (helm install -f/--set), merged over
	// the chart's values.yaml.
	Values map[string]any
	// Namespace is the release's namespace (helm install --namespace
	// --create-namespace); "gpudra" when empty.
	Namespace string
	// KubeVersion is the cluster's version; "v1.37.1" when empty.
	KubeVersion string
}

// Release is a rendered chart.
type Release struct {
	// Name and Namespace are the release's.
	Name, Namespace string
	// Objects are everything the chart rendered.
	Objects []Object
	// KubeletPlugin is the kubelet plugin DaemonSet's pod.
	KubeletPlugin *Pod
	// ComputeDomainPlugin is the same pod's compute-domains container
	// (the channel plugin); nil with computeDomains.enabled false.
	ComputeDomainPlugin *Pod
	// ComputeDomainController is the compute-domain controller
	// Deployment's pod; nil with computeDomains.enabled false.
	ComputeDomainController *Pod
	// Webhook is the webhook Deployment's pod, nil with webhook.enabled
	// false.
	Webhook *Pod
	// WebhookService is the webhook's Service, nil without a webhook.
	WebhookService *corev1.Service
}

// Render renders the chart with opts; a value the schema refuses is an
// error, as at helm install.
func Render(opts Options) (*Release, error) {
	if opts.Namespace == "" {
		opts.Namespace = "gpudra"
	}
	c, err := LoadChart(ChartDir())
	if err != nil {
		return nil, err
	}
	objs, err := RenderChart(c, opts)
	if err != nil {
		return nil, fmt.Errorf("helm install %s: %w", ChartPath, err)
	}
	r := &Release{Name: ReleaseName, Namespace: opts.Namespace, Objects: objs}
	for _, o := range objs {
		switch obj := o.Object.(type) {
		case *appsv1.DaemonSet:
			if r.KubeletPlugin != nil {
				return nil, fmt.Errorf("%s renders two DaemonSets (%s, %s): the local cluster knows only the kubelet plugin's", ChartPath, r.KubeletPlugin.Owner, o)
			}
			if r.KubeletPlugin, err = newPod(o.String(), obj.Namespace, obj.Spec.Template, "plugin"); err != nil {
				return nil, err
			}
			if hasContainer(obj.Spec.Template, "compute-domains") {
				if r.ComputeDomainPlugin, err = newPod(o.String(), obj.Namespace, obj.Spec.Template, "compute-domains"); err != nil {
					return nil, err
				}
			}
		case *appsv1.Deployment:
			var pod **Pod
			var container string
			switch component := obj.Spec.Template.Labels["app.kubernetes.io/component"]; component {
			case "webhook":
				pod, container = &r.Webhook, "webhook"
			case "compute-domain-controller":
				pod, container = &r.ComputeDomainController, "controller"
			default:
				return nil, fmt.Errorf("%s renders %s, which the local cluster does not know how to run", ChartPath, o)
			}
			if *pod != nil {
				return nil, fmt.Errorf("%s renders two Deployments of %s (%s, %s)", ChartPath, container, (*pod).Owner, o)
			}
			if *pod, err = newPod(o.String(), obj.Namespace, obj.Spec.Template, container); err != nil {
				return nil, err
			}
		case *corev1.Service:
			if obj.Spec.Selector["app.kubernetes.io/component"] == "webhook" {
				r.WebhookService = obj
			}
		}
	}
	if r.KubeletPlugin == nil {
		return nil, fmt.Errorf("%s renders no kubelet plugin DaemonSet", ChartPath)
	}
	if (r.ComputeDomainPlugin == nil) != (r.ComputeDomainController == nil) {
		return nil, fmt.Errorf("%s renders the ComputeDomain channel plugin without its controller, or the other way round", ChartPath)
	}
	if (r.Webhook == nil) != (r.WebhookService == nil) {
		return nil, fmt.Errorf("%s renders the webhook's Deployment without its Service, or the other way round", ChartPath)
	}
	return r, nil
}

// Manifests returns the objects to apply: every rendered object but the
// workloads, and first the release's namespace, which helm install
// --create-namespace creates.
func (r *Release) Manifests() ([]manifests.Object, error) {
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(r.Namespace)
	objs := []manifests.Object{{Unstructured: ns, Source: "helm install --create-namespace"}}
	for _, o := range r.Objects {
		switch o.Object.(type) {
		case *appsv1.DaemonSet, *appsv1.Deployment:
			continue
		}
		if o.Kind == "Namespace" && o.Name == r.Namespace {
			continue
		}
		u, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(o.Object)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o, err)
		}
		obj := &unstructured.Unstructured{Object: u}
		obj.SetGroupVersionKind(o.GVK)
		objs = append(objs, manifests.Object{Unstructured: obj, Source: ChartPath + "/" + o.Template})
	}
	return objs, nil
}

// Apply applies the release's manifests with apply (the local cluster's
// Apply) and fails on the first refusal.
func (r *Release) Apply(ctx context.Context, apply func(context.Context, []manifests.Object) ([]manifests.Refusal, error)) (int, error) {
	objs, err := r.Manifests()
	if err != nil {
		return 0, err
	}
	refused, err := apply(ctx, objs)
	if err != nil {
		return 0, err
	}
	if len(refused) > 0 {
		return 0, fmt.Errorf("helm install %s: the API server refused %d objects, the first %s", ChartPath, len(refused), refused[0])
	}
	return len(objs), nil
}
