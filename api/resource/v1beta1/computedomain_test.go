package v1beta1

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"
)

func TestComputeDomainConfigValidate(t *testing.T) {
	uid := "5a3d0c2e-7f1b-4c55-9d1e-0b8c2a4f6e71"
	tests := map[string]struct {
		in   string
		want string // "" means valid
	}{
		"channel, UID":            {in: doc("ComputeDomainChannelConfig", `"domainID": "`+uid+`"`)},
		"channel, mode All":       {in: doc("ComputeDomainChannelConfig", `"domainID": "`+uid+`", "allocationMode": "All"`)},
		"channel, mode Single":    {in: doc("ComputeDomainChannelConfig", `"domainID": "`+uid+`", "allocationMode": "Single"`)},
		"daemon, UID":             {in: doc("ComputeDomainDaemonConfig", `"domainID": "`+uid+`"`)},
		"channel, no domain":      {in: doc("ComputeDomainChannelConfig", ""), want: `domainID: Required value: the UID of the ComputeDomain`},
		"daemon, empty domain":    {in: doc("ComputeDomainDaemonConfig", `"domainID": ""`), want: `domainID: Required value`},
		"channel, path escape":    {in: doc("ComputeDomainChannelConfig", `"domainID": "../etc"`), want: `domainID: Invalid value: "../etc": must be the UID of a ComputeDomain`},
		"channel, dot dot":        {in: doc("ComputeDomainChannelConfig", `"domainID": ".."`), want: `domainID: Invalid value: ".."`},
		"daemon, slash":           {in: doc("ComputeDomainDaemonConfig", `"domainID": "a/b"`), want: `domainID: Invalid value: "a/b"`},
		"channel, too long":       {in: doc("ComputeDomainChannelConfig", `"domainID": "`+strings.Repeat("a", 64)+`"`), want: `must be no more than 63 bytes`},
		"channel, mode lowercase": {in: doc("ComputeDomainChannelConfig", `"domainID": "d", "allocationMode": "single"`), want: `allocationMode: Unsupported value: "single": supported values: "All", "Single"`},
		"channel, both wrong":     {in: doc("ComputeDomainChannelConfig", `"allocationMode": "Many"`), want: `[domainID: Required value: the UID of the ComputeDomain, allocationMode: Unsupported value: "Many"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			obj, err := Decode([]byte(tc.in))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			c := obj.(Config)
			c.Normalize()
			err = c.Validate(Features{})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("Validate accepted %s", tc.in)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("Validate = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestComputeDomainChannelConfigDefaults(t *testing.T) {
	c := DefaultComputeDomainChannelConfig()
	if c.AllocationMode != ChannelAllocationModeSingle || c.Kind != ComputeDomainChannelConfigKind || c.APIVersion != SchemeGroupVersion.String() {
		t.Errorf("DefaultComputeDomainChannelConfig() = %+v", c)
	}
	if err := c.Validate(Features{}); err == nil {
		t.Error("the default channel config names no domain, yet validates")
	}
	if d := DefaultComputeDomainDaemonConfig(); d.Kind != ComputeDomainDaemonConfigKind || d.Validate(Features{}) == nil {
		t.Errorf("DefaultComputeDomainDaemonConfig() = %+v", d)
	}
}

func TestValidateComputeDomainSpec(t *testing.T) {
	ch := func(name, mode string) *ComputeDomainChannelSpec {
		return &ComputeDomainChannelSpec{ResourceClaimTemplate: ComputeDomainResourceClaimTemplate{Name: name}, AllocationMode: mode}
	}
	tests := map[string]struct {
		spec ComputeDomainSpec
		want string
	}{
		"valid":            {spec: ComputeDomainSpec{Channel: ch("imex-channel", "")}},
		"valid, All":       {spec: ComputeDomainSpec{NumNodes: 4, Channel: ch("imex-channel", "All")}},
		"no channel":       {spec: ComputeDomainSpec{}, want: "spec.channel: Required value"},
		"no template name": {spec: ComputeDomainSpec{Channel: ch("", "")}, want: "spec.channel.resourceClaimTemplate.name: Required value"},
		"bad template name": {spec: ComputeDomainSpec{Channel: ch("Imex_Channel", "")},
			want: `spec.channel.resourceClaimTemplate.name: Invalid value: "Imex_Channel"`},
		"unknown mode": {spec: ComputeDomainSpec{Channel: ch("c", "Some")},
			want: `spec.channel.allocationMode: Unsupported value: "Some": supported values: "All", "Single"`},
		"negative numNodes": {spec: ComputeDomainSpec{NumNodes: -1, Channel: ch("c", "")}, want: "spec.numNodes: Invalid value: -1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateComputeDomainSpec(&tc.spec).ToAggregate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("ValidateComputeDomainSpec: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("ValidateComputeDomainSpec = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestComputeDomainJSON checks the field names against NVIDIA's: a domain
// as NVIDIA's demo manifests write it decodes strictly, and what gpudra
// writes uses the same names.
func TestComputeDomainJSON(t *testing.T) {
	in := `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
		"metadata": {"name": "imex-channel-injection"},
		"spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "imex-channel-0"}, "allocationMode": "Single"}},
		"status": {"status": "Ready", "nodes": [{"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "c.1", "index": 0, "status": "Ready"}]}}`
	var cd ComputeDomain
	strictErrs, err := kjson.UnmarshalStrict([]byte(in), &cd, kjson.DisallowUnknownFields)
	if err != nil || len(strictErrs) > 0 {
		t.Fatalf("strict decode: %v %v", err, strictErrs)
	}
	if cd.Spec.Channel.ResourceClaimTemplate.Name != "imex-channel-0" || cd.Status.Nodes[0].CliqueID != "c.1" {
		t.Fatalf("decoded %+v", cd)
	}
	clique := `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainClique",
		"metadata": {"name": "uid.c.1", "namespace": "gpudra"},
		"daemons": [{"nodeName": "n1", "ipAddress": "10.0.0.1", "cliqueID": "c.1", "index": 3, "status": "NotReady"}]}`
	var cq ComputeDomainClique
	strictErrs, err = kjson.UnmarshalStrict([]byte(clique), &cq, kjson.DisallowUnknownFields)
	if err != nil || len(strictErrs) > 0 || cq.Daemons[0].Index != 3 {
		t.Fatalf("strict decode of a clique: %v %v %+v", err, strictErrs, cq)
	}
	// index is written even when 0 (NVIDIA: optional, not omitempty).
	out, err := json.Marshal(ComputeDomainNode{Name: "n"})
	if err != nil || !strings.Contains(string(out), `"index":0`) {
		t.Errorf("marshalled node %s, %v", out, err)
	}
}

func TestComputeDomainScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddResourcesToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{ComputeDomainKind, ComputeDomainKind + "List", ComputeDomainCliqueKind, ComputeDomainCliqueKind + "List"} {
		if !s.Recognizes(SchemeGroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not know %s", kind)
		}
	}
	if s.Recognizes(SchemeGroupVersion.WithKind(GpuConfigKind)) {
		t.Error("the resources' scheme knows the config kinds")
	}
}

func TestComputeDomainDeepCopy(t *testing.T) {
	cd := &ComputeDomain{
		TypeMeta:   metav1.TypeMeta{Kind: ComputeDomainKind},
		ObjectMeta: metav1.ObjectMeta{Name: "d", Labels: map[string]string{"a": "b"}, Finalizers: []string{"f"}},
		Spec:       ComputeDomainSpec{NumNodes: 2, Channel: &ComputeDomainChannelSpec{ResourceClaimTemplate: ComputeDomainResourceClaimTemplate{Name: "t"}, AllocationMode: "All"}},
		Status: ComputeDomainStatus{Status: "Ready", Nodes: []*ComputeDomainNode{{Name: "n", IPAddress: "ip", CliqueID: "c", Index: 1, Status: "Ready"}},
			Conditions: []metav1.Condition{{Type: "Valid", Status: metav1.ConditionTrue}}},
	}
	before, _ := json.Marshal(cd)
	cp := cd.DeepCopyObject().(*ComputeDomain)
	if !equality.Semantic.DeepEqual(cp, cd) {
		t.Fatalf("copy differs: %+v", cp)
	}
	cp.Labels["a"] = "x"
	cp.Finalizers[0] = "x"
	cp.Spec.Channel.ResourceClaimTemplate.Name = "x"
	cp.Status.Nodes[0].Index = 9
	cp.Status.Conditions[0].Type = "x"
	if after, _ := json.Marshal(cd); string(after) != string(before) {
		t.Errorf("changing the copy changed the original: %s", after)
	}

	cq := &ComputeDomainClique{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Daemons: []*ComputeDomainDaemonInfo{{NodeName: "n", Index: 1}}}
	before, _ = json.Marshal(cq)
	ccp := cq.DeepCopyObject().(*ComputeDomainClique)
	ccp.Daemons[0].Index = 5
	if after, _ := json.Marshal(cq); string(after) != string(before) {
		t.Errorf("changing the clique's copy changed the original: %s", after)
	}
	list := &ComputeDomainList{Items: []ComputeDomain{*cd}}
	lcp := list.DeepCopyObject().(*ComputeDomainList)
	lcp.Items[0].Status.Nodes[0].Name = "x"
	if list.Items[0].Status.Nodes[0].Name != "n" {
		t.Error("changing the list's copy changed the original")
	}
	if (&ComputeDomainCliqueList{Items: []ComputeDomainClique{*cq}}).DeepCopyObject() == nil {
		t.Error("nil copy of a clique list")
	}
}
