package controller

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
)

type controllerHarness struct {
	t    *testing.T
	ctx  context.Context
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	c    *Controller
}

func newControllerHarness(t *testing.T, max int, domains ...*v1beta1.ComputeDomain) *controllerHarness {
	t.Helper()
	var objs []runtime.Object
	for _, d := range domains {
		objs = append(objs, toUnstructured(t, d))
	}
	_, ctx := ktesting.NewTestContext(t)
	h := &controllerHarness{t: t, ctx: ctx, kube: fake.NewClientset()}
	h.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{computedomain.GVR: "ComputeDomainList"}, objs...)
	h.c = New(Config{KubeClient: h.kube, DynamicClient: h.dyn, MaxChannels: max})
	if err := h.c.seed(h.ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

func toUnstructured(t *testing.T, d *v1beta1.ComputeDomain) *unstructured.Unstructured {
	t.Helper()
	d.APIVersion, d.Kind = v1beta1.SchemeGroupVersion.String(), v1beta1.ComputeDomainKind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func newDomain(name, template, mode string) *v1beta1.ComputeDomain {
	return &v1beta1.ComputeDomain{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: v1beta1.ComputeDomainSpec{Channel: &v1beta1.ComputeDomainChannelSpec{
			ResourceClaimTemplate: v1beta1.ComputeDomainResourceClaimTemplate{Name: template}, AllocationMode: mode,
		}},
	}
}

func (h *controllerHarness) reconcile(name string) {
	h.t.Helper()
	if err := h.c.Reconcile(h.ctx, "demo/"+name); err != nil {
		h.t.Fatalf("reconcile %s: %v", name, err)
	}
}

func (h *controllerHarness) get(name string) *v1beta1.ComputeDomain {
	h.t.Helper()
	obj, err := h.dyn.Resource(computedomain.GVR).Namespace("demo").Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	cd, err := computedomain.FromUnstructured(obj)
	if err != nil {
		h.t.Fatal(err)
	}
	return cd
}

func TestControllerCreatesTemplateAndChannel(t *testing.T) {
	h := newControllerHarness(t, 2048, newDomain("a", "a-channel", ""), newDomain("b", "b-channel", "All"))
	h.reconcile("a")
	h.reconcile("b")
	h.reconcile("a") // nothing changes the second time

	a, b := h.get("a"), h.get("b")
	if a.Status.Channel == nil || b.Status.Channel == nil || *a.Status.Channel == *b.Status.Channel {
		t.Fatalf("channels a %v, b %v: want two different ones", a.Status.Channel, b.Status.Channel)
	}
	for _, cd := range []*v1beta1.ComputeDomain{a, b} {
		if cd.Status.Status != v1beta1.ComputeDomainStatusReady || len(cd.Finalizers) != 1 || cd.Finalizers[0] != Finalizer {
			t.Errorf("%s: status %q, finalizers %v, conditions %+v", cd.Name, cd.Status.Status, cd.Finalizers, cd.Status.Conditions)
		}
	}

	tmpl, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "b-channel", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req := tmpl.Spec.Spec.Devices.Requests
	if len(req) != 1 || req[0].Exactly == nil || req[0].Exactly.DeviceClassName != ChannelDeviceClass {
		t.Fatalf("template requests %+v", req)
	}
	if len(tmpl.OwnerReferences) != 1 || tmpl.OwnerReferences[0].UID != b.UID || tmpl.Labels[DomainLabel] != string(b.UID) {
		t.Errorf("template owner %+v, labels %v", tmpl.OwnerReferences, tmpl.Labels)
	}
	// The template's config decodes as the plugin decodes it, strictly.
	cfgs := tmpl.Spec.Spec.Devices.Config
	if len(cfgs) != 1 || cfgs[0].Opaque == nil || cfgs[0].Opaque.Driver != computedomain.DriverName {
		t.Fatalf("template config %+v", cfgs)
	}
	decoded, err := v1beta1.Decode(cfgs[0].Opaque.Parameters.Raw)
	if err != nil {
		t.Fatalf("decode the template's config: %v", err)
	}
	ch, ok := decoded.(*v1beta1.ComputeDomainChannelConfig)
	if !ok || ch.DomainID != string(b.UID) || ch.AllocationMode != v1beta1.ChannelAllocationModeAll {
		t.Errorf("config %+v, want domainID %s, allocationMode All", decoded, b.UID)
	}
}

func TestControllerRefusesBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		name, template, mode string
		wantField            string
	}{
		{"no-template", "", "", "spec.channel.resourceClaimTemplate.name"},
		{"bad-mode", "t", "Some", "spec.channel.allocationMode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newControllerHarness(t, 8, newDomain(tc.name, tc.template, tc.mode))
			h.reconcile(tc.name)
			cd := h.get(tc.name)
			cond := meta.FindStatusCondition(cd.Status.Conditions, ConditionSpecValid)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonInvalidSpec || !strings.Contains(cond.Message, tc.wantField) {
				t.Errorf("condition %+v, want SpecValid False naming %s", cond, tc.wantField)
			}
			if cd.Status.Status != v1beta1.ComputeDomainStatusNotReady || cd.Status.Channel != nil {
				t.Errorf("status %q channel %v: want NotReady and no channel", cd.Status.Status, cd.Status.Channel)
			}
			list, _ := h.kube.ResourceV1().ResourceClaimTemplates("demo").List(h.ctx, metav1.ListOptions{})
			if len(list.Items) != 0 {
				t.Errorf("templates created for a bad spec: %v", list.Items)
			}
		})
	}
}

func TestControllerTemplateNameTaken(t *testing.T) {
	h := newControllerHarness(t, 8, newDomain("a", "taken", ""))
	if _, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Create(h.ctx, &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "taken"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.reconcile("a")
	cd := h.get("a")
	cond := meta.FindStatusCondition(cd.Status.Conditions, ConditionTemplateCreated)
	if cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "spec.channel.resourceClaimTemplate.name") || cd.Status.Status != v1beta1.ComputeDomainStatusNotReady {
		t.Errorf("condition %+v, status %q", cond, cd.Status.Status)
	}
}

// TestControllerTemplateCreateRefused: a creation the API server refuses
// is on the domain's status with the server's message, Reconcile fails so
// that the queue retries, and the next reconcile after the refusal ends
// creates the template and clears the condition.
func TestControllerTemplateCreateRefused(t *testing.T) {
	h := newControllerHarness(t, 8, newDomain("a", "a-channel", ""))
	refusal := apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaimtemplates"}, "a-channel", errors.New(`User "system:serviceaccount:gpudra:gpudra-compute-domain-controller" cannot create resource "resourceclaimtemplates"`))
	refuse := true
	h.kube.PrependReactor("create", "resourceclaimtemplates", func(k8stesting.Action) (bool, runtime.Object, error) {
		return refuse, nil, refusal
	})
	err := h.c.Reconcile(h.ctx, "demo/a")
	if !apierrors.IsForbidden(err) {
		t.Fatalf("reconcile: %v, want the refusal, for a retry", err)
	}
	cd := h.get("a")
	cond := meta.FindStatusCondition(cd.Status.Conditions, ConditionTemplateCreated)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonCreateFailed || !strings.Contains(cond.Message, refusal.Error()) || cd.Status.Status != v1beta1.ComputeDomainStatusNotReady {
		t.Fatalf("condition %+v, status %q; want %s=False, %s, with %q", cond, cd.Status.Status, ConditionTemplateCreated, ReasonCreateFailed, refusal.Error())
	}
	if cd.Status.Channel == nil {
		t.Error("the channel was not recorded before the template")
	}

	refuse = false
	h.reconcile("a")
	if _, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "a-channel", metav1.GetOptions{}); err != nil {
		t.Fatalf("template after the retry: %v", err)
	}
	cd = h.get("a")
	if cond := meta.FindStatusCondition(cd.Status.Conditions, ConditionTemplateCreated); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("condition after the retry %+v, want True", cond)
	}
}

func TestControllerDeletionCleansUp(t *testing.T) {
	h := newControllerHarness(t, 2, newDomain("a", "a-channel", ""), newDomain("b", "b-channel", ""))
	h.reconcile("a")
	h.reconcile("b")
	// Another controller's finalizer stays.
	a := h.get("a")
	a.Finalizers = append(a.Finalizers, "example.com/other")
	now := metav1.Now()
	a.DeletionTimestamp = &now
	if _, err := h.dyn.Resource(computedomain.GVR).Namespace("demo").Update(h.ctx, toUnstructured(t, a), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.reconcile("a")
	if _, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "a-channel", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("template of the deleted domain: %v, want not found", err)
	}
	if _, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "b-channel", metav1.GetOptions{}); err != nil {
		t.Errorf("the other domain's template: %v", err)
	}
	if got := h.get("a").Finalizers; len(got) != 1 || got[0] != "example.com/other" {
		t.Errorf("finalizers after cleanup %v, want only the other controller's", got)
	}
	// Its channel is free again: with two channels, a third domain fits.
	if _, err := h.dyn.Resource(computedomain.GVR).Namespace("demo").Create(h.ctx, toUnstructured(t, newDomain("c", "c-channel", "")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.reconcile("c")
	if c := h.get("c"); c.Status.Channel == nil || *c.Status.Channel != *a.Status.Channel {
		t.Errorf("c got %v, want a's freed channel %v", c.Status.Channel, *a.Status.Channel)
	}
	raw, _ := json.Marshal(h.get("c").Status)
	if !strings.Contains(string(raw), `"status":"Ready"`) {
		t.Errorf("c status %s", raw)
	}
}

func TestControllerChannelsExhausted(t *testing.T) {
	h := newControllerHarness(t, 1, newDomain("a", "a-channel", ""), newDomain("b", "b-channel", ""))
	h.reconcile("a")
	h.reconcile("b")
	b := h.get("b")
	cond := meta.FindStatusCondition(b.Status.Conditions, ConditionChannelAssigned)
	if cond == nil || cond.Reason != ReasonChannelsExhausted || b.Status.Channel != nil || b.Status.Status != v1beta1.ComputeDomainStatusNotReady {
		t.Errorf("b: %+v", b.Status)
	}
	if _, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "b-channel", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("template of a domain without a channel: %v, want none", err)
	}
}

// TestControllerRestartChangesNothing: a new controller (a new leader)
// seeded from what its predecessor wrote keeps every channel and writes
// nothing.
func TestControllerRestartChangesNothing(t *testing.T) {
	h := newControllerHarness(t, 8, newDomain("a", "a-channel", ""), newDomain("b", "b-channel", "All"))
	h.reconcile("a")
	h.reconcile("b")
	before := map[string]int32{"a": *h.get("a").Status.Channel, "b": *h.get("b").Status.Channel}
	h.dyn.ClearActions()
	h.kube.ClearActions()

	h.c = New(Config{KubeClient: h.kube, DynamicClient: h.dyn, MaxChannels: 8})
	if err := h.c.seed(h.ctx); err != nil {
		t.Fatal(err)
	}
	// Reconciled in the other order: a fresh assigner would swap them.
	h.reconcile("b")
	h.reconcile("a")
	for name, ch := range before {
		if got := h.get(name).Status.Channel; got == nil || *got != ch {
			t.Errorf("%s: channel %v after restart, want %d", name, got, ch)
		}
	}
	for _, a := range append(h.dyn.Actions(), h.kube.Actions()...) {
		switch a.GetVerb() {
		case "get", "list", "watch":
		case "create":
			// The template exists already: the create is refused.
		default:
			t.Errorf("restarted controller wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// TestControllerDeletionWaitsForClaims: a deleted domain keeps its
// channel, and its finalizer, while claims of it exist.
func TestControllerDeletionWaitsForClaims(t *testing.T) {
	h := newControllerHarness(t, 8, newDomain("a", "a-channel", ""))
	h.reconcile("a")
	tmpl, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "a-channel", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A claim made from the template, as the resource claim controller
	// makes it for a pod.
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "pod-a-channel"}, Spec: tmpl.Spec.Spec}
	if _, err := h.kube.ResourceV1().ResourceClaims("demo").Create(h.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := h.get("a")
	now := metav1.Now()
	a.DeletionTimestamp = &now
	if _, err := h.dyn.Resource(computedomain.GVR).Namespace("demo").Update(h.ctx, toUnstructured(t, a), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = h.c.Reconcile(h.ctx, "demo/a")
	var wait *WaitError
	if !errors.As(err, &wait) || !strings.Contains(err.Error(), "pod-a-channel") {
		t.Fatalf("reconcile with a claim left: %v, want a WaitError naming the claim", err)
	}
	if got := h.get("a").Finalizers; len(got) != 1 {
		t.Errorf("finalizer removed while a claim of the domain exists: %v", got)
	}
	if _, err := h.kube.ResourceV1().ResourceClaimTemplates("demo").Get(h.ctx, "a-channel", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("template kept while waiting: %v; it goes first, so no new claim is made", err)
	}
	if got, _ := h.c.channels.Assign("uid-new"); got == *a.Status.Channel {
		t.Errorf("the deleted domain's channel %d was handed out while its claim exists", got)
	}
	if err := h.kube.ResourceV1().ResourceClaims("demo").Delete(h.ctx, "pod-a-channel", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.reconcile("a")
	if got := h.get("a").Finalizers; len(got) != 0 {
		t.Errorf("finalizers %v once the claims are gone", got)
	}
}

// TestControllerStatusFromCliques: status.nodes and Ready come from the
// cliques the nodes write, never from a node writing the domain.
func TestControllerStatusFromCliques(t *testing.T) {
	cd := newDomain("a", "a-channel", "")
	cd.Spec.NumNodes = 2
	h := newControllerHarness(t, 8, cd)
	h.c = New(Config{KubeClient: h.kube, DynamicClient: h.dyn, MaxChannels: 8, CliqueNamespace: "gpudra"})
	if err := h.c.seed(h.ctx); err != nil {
		t.Fatal(err)
	}
	clique := func(name string, daemons ...*v1beta1.ComputeDomainDaemonInfo) *unstructured.Unstructured {
		cl := &v1beta1.ComputeDomainClique{ObjectMeta: metav1.ObjectMeta{Namespace: "gpudra", Name: name}, Daemons: daemons}
		cl.APIVersion, cl.Kind = v1beta1.SchemeGroupVersion.String(), v1beta1.ComputeDomainCliqueKind
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cl)
		if err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: m}
	}
	daemon := func(node, cliqueID string, index int, status string) *v1beta1.ComputeDomainDaemonInfo {
		return &v1beta1.ComputeDomainDaemonInfo{NodeName: node, IPAddress: "10.0.0.1", CliqueID: cliqueID, Index: index, Status: status}
	}
	store := h.c.cliques.GetStore()
	_ = store.Add(clique(computedomain.CliqueName("uid-a", "c.1"), daemon("n-b", "c.1", 1, v1beta1.ComputeDomainStatusNotReady), daemon("n-a", "c.1", 0, v1beta1.ComputeDomainStatusReady)))
	_ = store.Add(clique(computedomain.CliqueName("uid-other", "c.1"), daemon("n-x", "c.1", 0, v1beta1.ComputeDomainStatusReady)))
	h.reconcile("a")
	got := h.get("a")
	var names []string
	for _, n := range got.Status.Nodes {
		names = append(names, n.Name)
	}
	if strings.Join(names, ",") != "n-a,n-b" || got.Status.Status != v1beta1.ComputeDomainStatusNotReady {
		t.Fatalf("nodes %v, status %s: want n-a,n-b (by index) and NotReady (1 of numNodes 2 ready)", names, got.Status.Status)
	}
	_ = store.Update(clique(computedomain.CliqueName("uid-a", "c.1"), daemon("n-b", "c.1", 1, v1beta1.ComputeDomainStatusReady), daemon("n-a", "c.1", 0, v1beta1.ComputeDomainStatusReady)))
	h.reconcile("a")
	if got := h.get("a"); got.Status.Status != v1beta1.ComputeDomainStatusReady {
		t.Errorf("status %s with both nodes ready, want Ready", got.Status.Status)
	}
}
