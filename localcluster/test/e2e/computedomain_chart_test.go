package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/pkg/computedomain"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/install"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	cdcontroller "github.com/gpudra/gpudra/pkg/computedomain/controller"
)

// takeVerb removes verb from the rules of the ClusterRole name in the
// rendered chart that grant it on resource, dropping a rule left without
// verbs; it returns the rules it changed, as they were, for putting back.
func takeVerb(r *install.Release, name, resource, verb string) ([]rbacv1.PolicyRule, error) {
	for _, o := range r.Objects {
		cr, ok := o.Object.(*rbacv1.ClusterRole)
		if !ok || cr.Name != name {
			continue
		}
		var taken []rbacv1.PolicyRule
		var kept []rbacv1.PolicyRule
		for _, rule := range cr.Rules {
			if !slices.Contains(rule.Resources, resource) || !slices.Contains(rule.Verbs, verb) {
				kept = append(kept, rule)
				continue
			}
			taken = append(taken, *rule.DeepCopy())
			rule.Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == verb })
			if len(rule.Verbs) > 0 {
				kept = append(kept, rule)
			}
		}
		if len(taken) == 0 {
			return nil, fmt.Errorf("ClusterRole %s grants no %s on %s", name, verb, resource)
		}
		cr.Rules = kept
		return taken, nil
	}
	return nil, fmt.Errorf("no ClusterRole %s in the chart", name)
}

// TestChartRBACIsAllTheComputeDomainDriverHas: the ComputeDomain driver
// runs with the chart's RBAC and nothing else. Without create on
// resourceclaimtemplates the controller cannot make a domain's template,
// and the domain says so (ResourceClaimTemplateCreated=False, CreateFailed,
// the API server's refusal of the controller's ServiceAccount); without
// list on computedomains the channel plugin cannot find the domain of a
// claim, and Prepare fails naming the DaemonSet's ServiceAccount. Given
// each verb back, the controller and the kubelet retry and the pod runs.
func TestChartRBACIsAllTheComputeDomainDriverHas(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	const controllerRole, pluginRole = "gpudra-compute-domain-controller", "gpudra-compute-domain-kubelet-plugin"
	var controllerTaken, pluginTaken []rbacv1.PolicyRule
	c := startFleet(t, ctx, "cd-fleet", cdFleet, cluster.Options{BeforeChart: func(r *install.Release) error {
		var err error
		if controllerTaken, err = takeVerb(r, controllerRole, "resourceclaimtemplates", "create"); err != nil {
			return err
		}
		pluginTaken, err = takeVerb(r, pluginRole, "computedomains", "list")
		return err
	}})
	client := c.Client()
	putBack := func(name string, rules []rbacv1.PolicyRule) {
		t.Helper()
		cr, err := client.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The changed rules as they were, in place of what is left of them.
		cr.Rules = slices.DeleteFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.ContainsFunc(rules, func(taken rbacv1.PolicyRule) bool { return slices.Equal(taken.Resources, r.Resources) })
		})
		cr.Rules = append(cr.Rules, rules...)
		if _, err := client.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	applyIn(t, ctx, c, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cd-demo\n---\n"+fmt.Sprintf(nvidiaChannelDemo, "domain-r", "nvl-0"))

	// The controller's refusal, on the domain.
	ns := c.Release().Namespace
	wantCtrl := `User "system:serviceaccount:` + ns + `:` + c.Release().ComputeDomainController.ServiceAccount() + `" cannot create resource "resourceclaimtemplates"`
	var cond *metav1.Condition
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		obj, err := c.Dynamic().Resource(computedomain.GVR).Namespace("cd-demo").Get(ctx, "domain-r", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		cd, err := computedomain.FromUnstructured(obj)
		if err != nil {
			return false, err
		}
		cond = meta.FindStatusCondition(cd.Status.Conditions, cdcontroller.ConditionTemplateCreated)
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == cdcontroller.ReasonCreateFailed && strings.Contains(cond.Message, wantCtrl), nil
	})
	if err != nil {
		t.Fatalf("the domain does not show the refused template creation (want %s=False, %s, %q; got %+v): %v", cdcontroller.ConditionTemplateCreated, cdcontroller.ReasonCreateFailed, wantCtrl, cond, err)
	}
	t.Logf("without create on resourceclaimtemplates: %s", cond.Message)

	// The verb back: the controller retries and the template appears.
	putBack(controllerRole, controllerTaken)
	err = clustertest.Poll(ctx, time.Minute, func() bool {
		_, err := client.ResourceV1().ResourceClaimTemplates("cd-demo").Get(ctx, "domain-r-channel", metav1.GetOptions{})
		return err == nil
	})
	if err != nil {
		t.Fatalf("with create back the controller never made the template: %v", err)
	}

	// The channel plugin's refusal, at Prepare.
	wantPlugin := `User "system:serviceaccount:` + ns + `:` + c.Release().ComputeDomainPlugin.ServiceAccount() + `" cannot list resource "computedomains"`
	var last string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("cd-demo").Get(ctx, "domain-r", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodRunning {
			return false, fmt.Errorf("the pod runs although the channel plugin may not list ComputeDomains")
		}
		last = cluster.PodReason(p)
		return strings.Contains(last, wantPlugin), nil
	})
	if err != nil {
		t.Fatalf("the pod's claim was not refused for the missing verb (want %q, pod says %q): %v", wantPlugin, last, err)
	}
	t.Logf("without list on computedomains: %s", last)

	// The verb back: the kubelet retries Prepare and the pod runs.
	putBack(pluginRole, pluginTaken)
	waitForPodIn(t, ctx, c, "cd-demo", "domain-r", "Running", running)
	if err := client.CoreV1().Pods("cd-demo").Delete(ctx, "domain-r", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}
