// Package devicestatus publishes, in a ResourceClaim's status.devices
// (KEP-4817), what gpudra knows about each device it prepared for the
// claim: the device's UUID and, for a MIG device, the UUID of the GPU it
// lives on, so that monitoring can map a claim to the GPUs in use.
//
// Entries are written by server-side apply on the status subresource, with
// a field manager of their own per driver and node: entries of other
// drivers (and whatever else other writers own in the status) are left
// alone, and applying an empty set removes exactly this writer's entries.
//
// Since Kubernetes 1.36 (feature DRAResourceClaimGranularStatusAuthorization)
// the API server also checks a per-driver permission: verb
// "associated-node:patch" on resource "resourceclaims/driver", named after
// the driver, which a ServiceAccount holds only while its token names the
// node the claim is allocated on. deployments/rbac grants it.
//
// Every API call is bounded by a timeout ([WithTimeout], default
// [DefaultTimeout]) and made once: during an API outage a status write
// fails promptly instead of holding up Prepare or Unprepare, and whether to
// try again later is the caller's decision.
package devicestatus

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// ConditionReady is the condition type KEP-4817 asks drivers to set on a
// device configured as the claim asked; ReasonPrepared is its reason.
const (
	ConditionReady = "Ready"
	ReasonPrepared = "Prepared"
)

// fieldManagerMaxLength is the API server's limit on a field manager name.
const fieldManagerMaxLength = 128

// DefaultTimeout bounds each API call of a Writer unless [WithTimeout] says
// otherwise: ample for one apply to a healthy API server, short enough that
// a caller blocked on it during an outage is not noticed by the kubelet
// (whose NodePrepareResources and NodeUnprepareResources calls time out
// after 45s).
const DefaultTimeout = 5 * time.Second

// Device is one device this driver prepared for a claim.
type Device struct {
	// Pool and Name identify the device as the claim's allocation result
	// does.
	Pool string
	Name string
	// ShareID is the allocation's share ID for a share of a device with
	// consumable capacity; empty otherwise.
	ShareID string
	// UUID is the GPU's or MIG device's UUID. ParentUUID is the UUID of
	// the GPU a MIG device lives on; empty for a whole GPU.
	UUID       string
	ParentUUID string
}

func (d Device) key() deviceKey { return deviceKey{d.Pool, d.Name, d.ShareID} }

// Data is the JSON object in an entry's data field.
type Data struct {
	UUID       string `json:"uuid,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
}

// DecodeData reads the data of an entry written by this package; for
// consumers of the status and tests.
func DecodeData(raw *runtime.RawExtension) (Data, error) {
	var d Data
	if raw == nil || len(raw.Raw) == 0 {
		return d, errors.New("device status has no data")
	}
	if err := json.Unmarshal(raw.Raw, &d); err != nil {
		return d, fmt.Errorf("device status data: %w", err)
	}
	return d, nil
}

// Writer records and removes the device status entries of one driver on
// one node. It is safe for concurrent use by different claims.
type Writer struct {
	client       kubernetes.Interface
	driver       string
	node         string
	fieldManager string
	now          func() time.Time
	timeout      time.Duration
}

// Option configures a Writer.
type Option func(*Writer)

// WithClock replaces time.Now, which stamps new Ready conditions.
func WithClock(now func() time.Time) Option {
	return func(w *Writer) { w.now = now }
}

// WithTimeout bounds each API call of the Writer to d, which must be
// positive; the default is [DefaultTimeout]. A call also ends when its
// context does, whichever comes first.
func WithTimeout(d time.Duration) Option {
	return func(w *Writer) { w.timeout = d }
}

// NewWriter returns a Writer for driverName's kubelet plugin on nodeName.
func NewWriter(client kubernetes.Interface, driverName, nodeName string, opts ...Option) (*Writer, error) {
	switch {
	case client == nil:
		return nil, errors.New("device status writer: no API client")
	case driverName == "":
		return nil, errors.New("device status writer: no driver name")
	case nodeName == "":
		return nil, errors.New("device status writer: no node name")
	}
	w := &Writer{
		client:       client,
		driver:       driverName,
		node:         nodeName,
		fieldManager: FieldManager(driverName, nodeName),
		now:          time.Now,
		timeout:      DefaultTimeout,
	}
	for _, opt := range opts {
		opt(w)
	}
	if w.timeout <= 0 {
		return nil, fmt.Errorf("device status writer: timeout %v: must be positive", w.timeout)
	}
	return w, nil
}

// FieldManager returns the server-side apply field manager of driverName's
// plugin on nodeName: "<driver>/<node>", shortened with a hash of both
// where it would exceed the API server's 128 characters.
func FieldManager(driverName, nodeName string) string {
	name := driverName + "/" + nodeName
	if len(name) <= fieldManagerMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := "-" + hex.EncodeToString(sum[:8])
	return name[:fieldManagerMaxLength-len(suffix)] + suffix
}

// FieldManager returns the Writer's field manager.
func (w *Writer) FieldManager() string { return w.fieldManager }

// Record makes devices this writer's complete set of status entries in the
// claim: each gets its UUIDs as data and a Ready condition, and entries it
// recorded before that are not in devices are removed. claim is the claim
// as last read; a Ready condition already there keeps its transition time,
// so recording the same devices again changes nothing.
//
// Every device must be allocated to the claim by this writer's driver: the
// error for one that is not is permanent. API errors are returned wrapped
// (apierrors' predicates see through); a missing permission shows as an
// Invalid error naming resourceclaims/driver, or as Forbidden. An API
// server that does not answer within the writer's timeout gives an error
// that errors.Is reports as context.DeadlineExceeded: transient, the same
// call may succeed later. Record makes one API call and never retries.
func (w *Writer) Record(ctx context.Context, claim *resourceapi.ResourceClaim, devices []Device) error {
	if claim == nil || claim.Namespace == "" || claim.Name == "" {
		return errors.New("record device status: no claim, or one without namespace and name")
	}
	ref := klog.KObj(claim)
	entries, err := w.entries(claim, devices)
	if err != nil {
		return fmt.Errorf("record device status of claim %s: %w", ref, err)
	}
	ac := resourceac.ResourceClaim(claim.Name, claim.Namespace)
	if len(entries) > 0 {
		// No status at all rather than an empty one when there is
		// nothing to record: an empty status would leave this manager
		// owning the status field itself.
		ac.WithStatus(resourceac.ResourceClaimStatus().WithDevices(entries...))
	}
	if claim.UID != "" {
		// A claim recreated under the same name is not this claim: the
		// API server refuses to change the UID.
		ac.WithUID(claim.UID)
	}
	if _, err := w.apply(ctx, ac); err != nil {
		return fmt.Errorf("record device status of claim %s (driver %s, node %s): %w", ref, w.driver, w.node, err)
	}
	klog.FromContext(ctx).V(4).Info("Recorded device status", "claim", ref, "devices", len(devices))
	return nil
}

// Remove removes this writer's status entries from the claim, for when the
// claim is unprepared but may live on. A claim that is gone, or that was
// recreated under the same name (another UID), has none of its entries:
// that is success. Removing entries that are not there is a no-op. Like
// Record, it makes one API call bounded by the writer's timeout, never
// retries, and reports an unanswered call as context.DeadlineExceeded.
func (w *Writer) Remove(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	if claim.Namespace == "" || claim.Name == "" {
		return fmt.Errorf("remove device status: claim %q in namespace %q: both must be set", claim.Name, claim.Namespace)
	}
	// Applying no fields at all gives up every field this manager owns.
	ac := resourceac.ResourceClaim(claim.Name, claim.Namespace)
	if claim.UID != "" {
		ac.WithUID(claim.UID)
	}
	_, err := w.apply(ctx, ac)
	switch {
	case err == nil:
	case apierrors.IsNotFound(err), isUIDMismatch(err):
		klog.FromContext(ctx).V(4).Info("Claim gone; no device status to remove", "claim", klog.KRef(claim.Namespace, claim.Name), "claimUID", claim.UID)
		return nil
	default:
		return fmt.Errorf("remove device status of claim %s (driver %s, node %s): %w", klog.KRef(claim.Namespace, claim.Name), w.driver, w.node, err)
	}
	klog.FromContext(ctx).V(4).Info("Removed device status", "claim", klog.KRef(claim.Namespace, claim.Name))
	return nil
}

// apply applies ac to the claim's status, within the writer's timeout.
// Force: the entries are this writer's alone, and an entry another manager
// wrote for the same device (an older plugin instance) is taken over rather
// than left in conflict.
func (w *Writer) apply(ctx context.Context, ac *resourceac.ResourceClaimApplyConfiguration) (*resourceapi.ResourceClaim, error) {
	callCtx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	claim, err := w.client.ResourceV1().ResourceClaims(*ac.GetNamespace()).ApplyStatus(callCtx, ac,
		metav1.ApplyOptions{FieldManager: w.fieldManager, Force: true})
	if err != nil && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
		// client-go words an expired context in several ways (transport,
		// rate limiter), not all of them wrapping it: say what happened.
		if !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		return nil, fmt.Errorf("API server did not answer within %v: %w", w.timeout, err)
	}
	return claim, err
}

type deviceKey struct{ pool, name, shareID string }

func (k deviceKey) String() string {
	if k.shareID != "" {
		return k.pool + "/" + k.name + " (share " + k.shareID + ")"
	}
	return k.pool + "/" + k.name
}

// entries checks devices against the claim's allocation and builds their
// status entries, sorted.
func (w *Writer) entries(claim *resourceapi.ResourceClaim, devices []Device) ([]*resourceac.AllocatedDeviceStatusApplyConfiguration, error) {
	if len(devices) == 0 {
		return nil, nil
	}
	if claim.Status.Allocation == nil {
		return nil, errors.New("claim is not allocated")
	}
	allocated := map[deviceKey]bool{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != w.driver {
			continue
		}
		k := deviceKey{pool: r.Pool, name: r.Device}
		if r.ShareID != nil {
			k.shareID = string(*r.ShareID)
		}
		allocated[k] = true
	}
	readySince := map[deviceKey]metav1.Time{}
	for _, s := range claim.Status.Devices {
		if s.Driver != w.driver {
			continue
		}
		k := deviceKey{pool: s.Pool, name: s.Device}
		if s.ShareID != nil {
			k.shareID = *s.ShareID
		}
		for _, c := range s.Conditions {
			if c.Type == ConditionReady && c.Status == metav1.ConditionTrue {
				readySince[k] = c.LastTransitionTime
			}
		}
	}

	sorted := slices.Clone(devices)
	slices.SortFunc(sorted, func(a, b Device) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Name, b.Name), cmp.Compare(a.ShareID, b.ShareID))
	})
	now := metav1.NewTime(w.now())
	out := make([]*resourceac.AllocatedDeviceStatusApplyConfiguration, 0, len(sorted))
	for i, d := range sorted {
		k := d.key()
		if i > 0 && sorted[i-1].key() == k {
			return nil, fmt.Errorf("device %s listed twice", k)
		}
		if !allocated[k] {
			return nil, fmt.Errorf("device %s is not allocated to the claim by driver %s", k, w.driver)
		}
		since, ok := readySince[k]
		if !ok {
			since = now
		}
		entry := resourceac.AllocatedDeviceStatus().
			WithDriver(w.driver).
			WithPool(d.Pool).
			WithDevice(d.Name).
			WithConditions(metav1ac.Condition().
				WithType(ConditionReady).
				WithStatus(metav1.ConditionTrue).
				WithReason(ReasonPrepared).
				WithObservedGeneration(claim.Generation).
				WithLastTransitionTime(since))
		if d.ShareID != "" {
			entry.WithShareID(d.ShareID)
		}
		if d.UUID != "" || d.ParentUUID != "" {
			data, err := json.Marshal(Data{UUID: d.UUID, ParentUUID: d.ParentUUID})
			if err != nil {
				return nil, fmt.Errorf("device %s: %w", k, err)
			}
			entry.WithData(runtime.RawExtension{Raw: data})
		}
		out = append(out, entry)
	}
	return out, nil
}

// isUIDMismatch reports whether the API server refused an apply because
// the claim under that name has another UID: the claim was recreated.
func isUIDMismatch(err error) bool {
	if !apierrors.IsInvalid(err) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == "metadata.uid" {
			return true
		}
	}
	return false
}
