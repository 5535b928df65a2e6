package devicestatus

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
)

const (
	driver = "gpu.nvidia.com"
	node   = "node-a"
)

var (
	t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	t1 = t0.Add(time.Hour)
)

// allocatedClaim is a claim allocated two of our devices (one a MIG
// device, one a share) and one of another driver.
func allocatedClaim() *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim", UID: "claim-uid", Generation: 1},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "gpu", Driver: driver, Pool: node, Device: "gpu-0"},
					{Request: "mig", Driver: driver, Pool: node, Device: "gpu-1-mig-1g10gb-0-0"},
					{Request: "share", Driver: driver, Pool: node, Device: "gpu-2", ShareID: ptr.To(types.UID("0a1b2c3d-0000-4000-8000-000000000001"))},
					{Request: "nic", Driver: "nic.example.com", Pool: node, Device: "nic-0"},
				},
			}},
		},
	}
}

var ourDevices = []Device{
	{Pool: node, Name: "gpu-1-mig-1g10gb-0-0", UUID: "MIG-1111", ParentUUID: "GPU-1111"},
	{Pool: node, Name: "gpu-0", UUID: "GPU-0000"},
	{Pool: node, Name: "gpu-2", ShareID: "0a1b2c3d-0000-4000-8000-000000000001", UUID: "GPU-2222"},
}

// appliedClaim returns the ResourceClaim sent by the one apply among the
// actions, and checks how it was sent.
func appliedClaim(t *testing.T, actions []k8stesting.Action) *resourceapi.ResourceClaim {
	t.Helper()
	var patches []k8stesting.PatchActionImpl
	for _, a := range actions {
		if p, ok := a.(k8stesting.PatchActionImpl); ok {
			patches = append(patches, p)
		}
	}
	if len(patches) != 1 {
		t.Fatalf("got %d patches, want 1: %v", len(patches), actions)
	}
	p := patches[0]
	if p.GetPatchType() != types.ApplyPatchType || p.GetSubresource() != "status" {
		t.Errorf("patch type %s subresource %q, want apply to status", p.GetPatchType(), p.GetSubresource())
	}
	if p.PatchOptions.FieldManager != FieldManager(driver, node) || p.PatchOptions.Force == nil || !*p.PatchOptions.Force {
		t.Errorf("patch options %+v, want forced apply as %s", p.PatchOptions, FieldManager(driver, node))
	}
	claim := &resourceapi.ResourceClaim{}
	if err := json.Unmarshal(p.GetPatch(), claim); err != nil {
		t.Fatal(err)
	}
	return claim
}

func TestRecord(t *testing.T) {
	claim := allocatedClaim()
	// Another driver's entry, and one of ours that was Ready since t0.
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{
		{Driver: "nic.example.com", Pool: node, Device: "nic-0"},
		{Driver: driver, Pool: node, Device: "gpu-0", Conditions: []metav1.Condition{
			{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonPrepared, LastTransitionTime: metav1.NewTime(t0)},
		}},
	}
	client := fake.NewClientset(claim)
	w, err := NewWriter(client, driver, node, WithClock(func() time.Time { return t1 }))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Record(context.Background(), claim, ourDevices); err != nil {
		t.Fatal(err)
	}
	sent := appliedClaim(t, client.Actions())
	if sent.Name != "claim" || sent.Namespace != "ns" || sent.UID != "claim-uid" {
		t.Errorf("applied to %s/%s uid %q", sent.Namespace, sent.Name, sent.UID)
	}
	if sent.Status.Allocation != nil || sent.Status.ReservedFor != nil {
		t.Errorf("apply carries fields it must not own: %+v", sent.Status)
	}
	type want struct {
		device, shareID string
		data            Data
		since           time.Time
	}
	wants := []want{
		// Sorted by pool, device, share; gpu-0 keeps its time.
		{"gpu-0", "", Data{UUID: "GPU-0000"}, t0},
		{"gpu-1-mig-1g10gb-0-0", "", Data{UUID: "MIG-1111", ParentUUID: "GPU-1111"}, t1},
		{"gpu-2", "0a1b2c3d-0000-4000-8000-000000000001", Data{UUID: "GPU-2222"}, t1},
	}
	if len(sent.Status.Devices) != len(wants) {
		t.Fatalf("sent %d entries, want %d: %+v", len(sent.Status.Devices), len(wants), sent.Status.Devices)
	}
	for i, want := range wants {
		got := sent.Status.Devices[i]
		if got.Driver != driver || got.Pool != node || got.Device != want.device || ptr.Deref(got.ShareID, "") != want.shareID {
			t.Errorf("entry %d is %s/%s/%s share %q, want device %s share %q", i, got.Driver, got.Pool, got.Device, ptr.Deref(got.ShareID, ""), want.device, want.shareID)
		}
		data, err := DecodeData(got.Data)
		if err != nil || data != want.data {
			t.Errorf("entry %d data %+v (%v), want %+v", i, data, err, want.data)
		}
		if len(got.Conditions) != 1 {
			t.Fatalf("entry %d conditions %+v", i, got.Conditions)
		}
		c := got.Conditions[0]
		if c.Type != ConditionReady || c.Status != metav1.ConditionTrue || c.Reason != ReasonPrepared || c.ObservedGeneration != 1 || !c.LastTransitionTime.Time.Equal(want.since) {
			t.Errorf("entry %d condition %+v, want Ready=True since %v", i, c, want.since)
		}
	}
	// The data is a small JSON object with exactly the documented keys.
	var raw map[string]any
	if err := json.Unmarshal(sent.Status.Devices[1].Data.Raw, &raw); err != nil || len(raw) != 2 || raw["uuid"] != "MIG-1111" || raw["parentUUID"] != "GPU-1111" {
		t.Errorf("MIG data %s", sent.Status.Devices[1].Data.Raw)
	}
	if got := string(sent.Status.Devices[0].Data.Raw); got != `{"uuid":"GPU-0000"}` {
		t.Errorf("GPU data %s, want no parentUUID", got)
	}
}

func TestRecordRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		claim   func() *resourceapi.ResourceClaim
		devices []Device
		want    string
	}{
		{
			name:    "not allocated",
			claim:   func() *resourceapi.ResourceClaim { c := allocatedClaim(); c.Status.Allocation = nil; return c },
			devices: ourDevices[:1],
			want:    "claim is not allocated",
		},
		{
			name:    "device not allocated",
			claim:   allocatedClaim,
			devices: []Device{{Pool: node, Name: "gpu-7"}},
			want:    "device node-a/gpu-7 is not allocated to the claim by driver gpu.nvidia.com",
		},
		{
			name:    "another driver's device",
			claim:   allocatedClaim,
			devices: []Device{{Pool: node, Name: "nic-0"}},
			want:    "device node-a/nic-0 is not allocated",
		},
		{
			name:    "share ID missing",
			claim:   allocatedClaim,
			devices: []Device{{Pool: node, Name: "gpu-2"}},
			want:    "device node-a/gpu-2 is not allocated",
		},
		{
			name:    "wrong pool",
			claim:   allocatedClaim,
			devices: []Device{{Pool: "node-b", Name: "gpu-0"}},
			want:    "device node-b/gpu-0 is not allocated",
		},
		{
			name:    "listed twice",
			claim:   allocatedClaim,
			devices: []Device{ourDevices[1], ourDevices[1]},
			want:    "device node-a/gpu-0 listed twice",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := tc.claim()
			client := fake.NewClientset(claim)
			w, err := NewWriter(client, driver, node)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Record(context.Background(), claim, tc.devices)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "ns/claim") {
				t.Errorf("got error %v, want one naming the claim and %q", err, tc.want)
			}
			if len(client.Actions()) != 0 {
				t.Errorf("an invalid record reached the API: %v", client.Actions())
			}
		})
	}
}

// TestRecordNothing checks that recording no devices applies an empty
// set, which removes what this writer recorded before.
func TestRecordNothing(t *testing.T) {
	claim := allocatedClaim()
	client := fake.NewClientset(claim)
	w, err := NewWriter(client, driver, node)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Record(context.Background(), claim, nil); err != nil {
		t.Fatal(err)
	}
	if sent := appliedClaim(t, client.Actions()); len(sent.Status.Devices) != 0 {
		t.Errorf("sent entries %+v", sent.Status.Devices)
	}
}

func TestRemove(t *testing.T) {
	ref := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim"}, UID: "claim-uid"}
	gr := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}
	for _, tc := range []struct {
		name    string
		apiErr  error
		wantErr func(error) bool
	}{
		{name: "present"},
		{name: "gone", apiErr: apierrors.NewNotFound(gr, "claim")},
		{
			name: "recreated",
			apiErr: apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "claim", field.ErrorList{
				field.Invalid(field.NewPath("metadata", "uid"), "new-uid", "field is immutable"),
			}),
		},
		{name: "forbidden", apiErr: apierrors.NewForbidden(gr, "claim", nil), wantErr: apierrors.IsForbidden},
		{
			name: "other invalid",
			apiErr: apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "claim", field.ErrorList{
				field.Forbidden(field.NewPath("status", "devices"), `changing status.devices requires resource="resourceclaims/driver"`),
			}),
			wantErr: apierrors.IsInvalid,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, allocatedClaim(), tc.apiErr
			})
			w, err := NewWriter(client, driver, node)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Remove(context.Background(), ref)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.wantErr != nil && (err == nil || !tc.wantErr(err) || !strings.Contains(err.Error(), "remove device status of claim ns/claim")):
				t.Errorf("got error %v, want a wrapped API error", err)
			}
			sent := appliedClaim(t, client.Actions())
			if sent.UID != "claim-uid" || len(sent.Status.Devices) != 0 {
				t.Errorf("sent uid %q entries %+v; want the UID and no entries", sent.UID, sent.Status.Devices)
			}
		})
	}
}

func TestFieldManager(t *testing.T) {
	long := strings.Repeat("n", 253)
	for _, tc := range []struct {
		driver, node string
		want         string
	}{
		{driver, node, "gpu.nvidia.com/node-a"},
		{driver, long, ""},
	} {
		got := FieldManager(tc.driver, tc.node)
		if len(got) > fieldManagerMaxLength {
			t.Errorf("FieldManager(%q, %d chars) is %d chars long", tc.driver, len(tc.node), len(got))
		}
		if tc.want != "" && got != tc.want {
			t.Errorf("FieldManager(%q, %q) = %q, want %q", tc.driver, tc.node, got, tc.want)
		}
	}
	// Long names that share a prefix still get managers of their own.
	a, b := FieldManager(driver, long+"a"), FieldManager(driver, long+"b")
	if a == b {
		t.Errorf("two long node names share field manager %q", a)
	}
}

func TestNewWriterRequires(t *testing.T) {
	client := fake.NewClientset()
	for _, tc := range []struct {
		name   string
		call   func() (*Writer, error)
		errSub string
	}{
		{"client", func() (*Writer, error) { return NewWriter(nil, driver, node) }, "no API client"},
		{"driver", func() (*Writer, error) { return NewWriter(client, "", node) }, "no driver name"},
		{"node", func() (*Writer, error) { return NewWriter(client, driver, "") }, "no node name"},
	} {
		if _, err := tc.call(); err == nil || !strings.Contains(err.Error(), tc.errSub) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.errSub)
		}
	}
}

// TestRoundTrip runs Record and Remove against the fake clientset's
// server-side apply emulation: entries of another driver stay, a device
// left out of a second Record loses its entry, Remove leaves none of ours.
// localcluster/test/rbactest does the same against a real API server.
func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	claim := allocatedClaim()
	nic := resourceapi.AllocatedDeviceStatus{Driver: "nic.example.com", Pool: node, Device: "nic-0"}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{nic}
	client := fake.NewClientset(claim)
	w, err := NewWriter(client, driver, node, WithClock(func() time.Time { return t0 }))
	if err != nil {
		t.Fatal(err)
	}
	devicesOf := func() []string {
		t.Helper()
		got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "claim", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allocation == nil {
			t.Error("the allocation was lost")
		}
		var out []string
		for _, d := range got.Status.Devices {
			out = append(out, d.Driver+"/"+d.Device)
		}
		return out
	}
	for _, step := range []struct {
		name string
		do   func() error
		want []string
	}{
		{"record all", func() error { return w.Record(ctx, claim, ourDevices) },
			[]string{"nic.example.com/nic-0", "gpu.nvidia.com/gpu-0", "gpu.nvidia.com/gpu-1-mig-1g10gb-0-0", "gpu.nvidia.com/gpu-2"}},
		{"record one", func() error { return w.Record(ctx, claim, ourDevices[1:2]) },
			[]string{"nic.example.com/nic-0", "gpu.nvidia.com/gpu-0"}},
		{"remove", func() error {
			return w.Remove(ctx, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim"}, UID: "claim-uid"})
		}, []string{"nic.example.com/nic-0"}},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := devicesOf(); strings.Join(got, " ") != strings.Join(step.want, " ") {
			t.Errorf("%s: entries %v, want %v", step.name, got, step.want)
		}
	}
}

func TestRequiresClaimName(t *testing.T) {
	client := fake.NewClientset()
	w, err := NewWriter(client, driver, node)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	unnamed := allocatedClaim()
	unnamed.Name = ""
	for name, err := range map[string]error{
		"record nil":     w.Record(ctx, nil, ourDevices),
		"record unnamed": w.Record(ctx, unnamed, ourDevices),
		"remove unnamed": w.Remove(ctx, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "ns"}}),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if len(client.Actions()) != 0 {
		t.Errorf("calls reached the API: %v", client.Actions())
	}
}

// TestAPICallTimeout runs Record and Remove against a real HTTP server
// standing in for an API server behind a partition: it takes the request
// and answers late or never. Every call must return within the writer's
// timeout with an error that says so, after exactly one request.
func TestAPICallTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	ref := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim"}, UID: "claim-uid"}
	never := time.Duration(-1)
	for _, tc := range []struct {
		name string
		// delay is how long the server takes to answer; never: it does not.
		delay     time.Duration
		parentCtx time.Duration // a deadline of the caller's own, if set
		call      func(context.Context, *Writer) error
		wantErr   bool
		wantMsg   string
	}{
		{name: "remove, no answer", delay: never, call: func(ctx context.Context, w *Writer) error { return w.Remove(ctx, ref) },
			wantErr: true, wantMsg: "remove device status of claim ns/claim (driver gpu.nvidia.com, node node-a): API server did not answer within 300ms"},
		{name: "record, no answer", delay: never, call: func(ctx context.Context, w *Writer) error { return w.Record(ctx, allocatedClaim(), ourDevices) },
			wantErr: true, wantMsg: "record device status of claim ns/claim (driver gpu.nvidia.com, node node-a): API server did not answer within 300ms"},
		{name: "remove, answer too late", delay: 3 * timeout, call: func(ctx context.Context, w *Writer) error { return w.Remove(ctx, ref) },
			wantErr: true, wantMsg: "API server did not answer within 300ms"},
		{name: "remove, answer in time", delay: 0, call: func(ctx context.Context, w *Writer) error { return w.Remove(ctx, ref) }},
		{name: "record, answer in time", delay: timeout / 10, call: func(ctx context.Context, w *Writer) error { return w.Record(ctx, allocatedClaim(), ourDevices) }},
		// The caller's shorter deadline wins, and is reported as the
		// caller's, not as the writer's timeout.
		{name: "remove, caller's deadline first", delay: never, parentCtx: timeout / 3, call: func(ctx context.Context, w *Writer) error { return w.Remove(ctx, ref) },
			wantErr: true, wantMsg: "remove device status of claim ns/claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var requests atomic.Int32
			done := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				if r.Method != http.MethodPatch || r.URL.Path != "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim/status" {
					t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
				}
				if tc.delay == never {
					select {
					case <-r.Context().Done():
					case <-done:
					}
					return
				}
				select {
				case <-time.After(tc.delay):
				case <-done:
					return
				}
				claim := allocatedClaim()
				claim.APIVersion, claim.Kind = "resource.k8s.io/v1", "ResourceClaim"
				rw.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(rw).Encode(claim)
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(done) })
			client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			w, err := NewWriter(client, driver, node, WithTimeout(timeout))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tc.parentCtx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.parentCtx)
				defer cancel()
			}

			start := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- tc.call(ctx, w) }()
			// Generous slack for a loaded machine; without the timeout the
			// calls that get no answer never return at all.
			limit := timeout + 2*time.Second
			select {
			case err = <-errc:
			case <-time.After(limit):
				t.Fatalf("call still blocked after %v; the timeout is %v", limit, timeout)
			}
			if elapsed := time.Since(start); elapsed > limit {
				t.Errorf("call took %v, want at most the timeout %v (plus slack)", elapsed, timeout)
			}
			if got := requests.Load(); got != 1 {
				t.Errorf("server saw %d requests, want exactly 1 (no retries)", got)
			}
			if !tc.wantErr {
				if err != nil {
					t.Errorf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got error %v, want context.DeadlineExceeded and %q", err, tc.wantMsg)
			}
			if tc.parentCtx > 0 && strings.Contains(err.Error(), "did not answer within") {
				t.Errorf("the caller's deadline is reported as the writer's timeout: %v", err)
			}
		})
	}
}

func TestWithTimeoutMustBePositive(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := NewWriter(fake.NewClientset(), driver, node, WithTimeout(d)); err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("WithTimeout(%v): got %v, want an error", d, err)
		}
	}
	w, err := NewWriter(fake.NewClientset(), driver, node)
	if err != nil {
		t.Fatal(err)
	}
	if w.timeout != DefaultTimeout {
		t.Errorf("default timeout %v, want %v", w.timeout, DefaultTimeout)
	}
}
