package draplugin

import (
	"errors"
	"fmt"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// eventComponent is the source of the Node events gpudra records.
const eventComponent = preparer.EventComponent

// events records Node events. The broadcaster and its two goroutines
// start at the first event: a healthy idle node records none, and a
// process that simulates a thousand nodes would otherwise run two
// thousand goroutines waiting for them.
type events struct {
	client   kubernetes.Interface
	nodeName string
	nodeRef  *corev1.ObjectReference

	mu          sync.Mutex
	rec         record.EventRecorder
	broadcaster record.EventBroadcaster
	stopped     bool
}

func newEvents(client kubernetes.Interface, nodeName string) *events {
	return &events{
		client:   client,
		nodeName: nodeName,
		nodeRef:  &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName},
	}
}

// recorder returns the event recorder, starting the broadcaster on the
// first call. After stop it returns a recorder that drops events.
func (e *events) recorder() record.EventRecorder {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.rec == nil && !e.stopped {
		e.broadcaster = record.NewBroadcaster()
		e.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: e.client.CoreV1().Events("")})
		e.rec = e.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventComponent, Host: e.nodeName})
	}
	if e.rec == nil {
		return &record.FakeRecorder{}
	}
	return e.rec
}

// stop shuts the broadcaster down, if it started.
func (e *events) stop() {
	e.mu.Lock()
	b := e.broadcaster
	e.stopped = true
	e.mu.Unlock()
	if b != nil {
		b.Shutdown()
	}
}

// Event records an event on this node's Node object, where operators look
// for node-level trouble.
func (d *Driver) Event(eventType, reason, message string) {
	d.events.node(eventType, reason, message)
}

// node records an event on the Node object.
func (e *events) node(eventType, reason, message string) {
	e.recorder().Event(e.nodeRef, eventType, reason, message)
}

// ReasonPrepareFailed is the reason of the Warning events a refused Prepare
// records on the claim and on the pods or PodGroup it is reserved for.
const ReasonPrepareFailed = "PrepareFailed"

// prepareFailed records err on the claim and on every pod or PodGroup
// (KEP-5729) the claim is reserved for, so that `kubectl describe` of
// either says at once why the pods do not start, instead of a kubelet
// retrying in silence. The recorder folds repeats of one message into one
// event with a count. A PodGroup's claim serves pods the plugin is not
// told about, so the event goes to the PodGroup, not to them.
func (e *events) prepareFailed(claim *resourceapi.ResourceClaim, err error) {
	message := err.Error()
	e.recorder().Event(&corev1.ObjectReference{
		APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID,
	}, corev1.EventTypeWarning, ReasonPrepareFailed, message)
	for _, consumer := range claim.Status.ReservedFor {
		ref := consumerRef(claim.Namespace, consumer)
		if ref == nil {
			continue
		}
		e.recorder().Event(ref, corev1.EventTypeWarning, ReasonPrepareFailed, message)
	}
}

// consumerRef is the event's object for a status.reservedFor entry: a pod
// or a PodGroup; nil for a kind the plugin does not know the version of.
func consumerRef(namespace string, consumer resourceapi.ResourceClaimConsumerReference) *corev1.ObjectReference {
	ref := &corev1.ObjectReference{Namespace: namespace, Name: consumer.Name, UID: consumer.UID}
	switch {
	case consumer.APIGroup == "" && consumer.Resource == "pods":
		ref.APIVersion, ref.Kind = "v1", "Pod"
	case consumer.APIGroup == schedulingv1beta1.GroupName && consumer.Resource == "podgroups":
		ref.APIVersion, ref.Kind = schedulingv1beta1.SchemeGroupVersion.String(), "PodGroup"
	default:
		return nil
	}
	return ref
}

// onCorruptCheckpoint is called by the checkpoint store, on its own
// goroutine, when the file turns out unreadable while the plugin runs. The
// store refuses every call until the claims prepared on the node are
// adopted: the next Prepare or Unprepare adopts them first, and the sweep
// is woken to do it at once.
func (d *Driver) onCorruptCheckpoint(cf checkpoint.CorruptFile) {
	if cf.Path == "" {
		d.logger.Error(cf.Err, "Checkpoint lost, with nothing left to move aside. Claims with a CDI spec on this node are adopted before anything else is prepared")
	} else {
		d.logger.Error(cf.Err, "Checkpoint became unreadable; moved aside. Claims with a CDI spec on this node are adopted before anything else is prepared", "movedTo", cf.Path)
	}
	d.Event(corev1.EventTypeWarning, "CheckpointUnreadable", lostCheckpointMessage(cf))
	if d.sweeper != nil {
		d.sweeper.wake()
	}
}

// lostCheckpointMessage is the Node event's message for a checkpoint lost
// while the plugin runs or found lost at start: where it was moved, or, when
// nothing was left to move aside (Path ""), that it disappeared.
func lostCheckpointMessage(cf checkpoint.CorruptFile) string {
	switch {
	case cf.Path != "":
		return unreadableMessage(cf)
	case errors.Is(cf.Err, checkpoint.ErrDisappeared):
		return fmt.Sprintf("gpudra checkpoint disappeared (%v): it was deleted or moved aside by another program, so the claims prepared on this node are adopted before anything else is prepared", cf.Err)
	default:
		return fmt.Sprintf("gpudra checkpoint was lost, with nothing left to move aside, so the claims prepared on this node are adopted before anything else is prepared: %v", cf.Err)
	}
}

// reportCheckpoint logs and records what opening the checkpoint found.
func (e *events) reportCheckpoint(logger klog.Logger, r checkpoint.OpenReport) {
	event := func(eventType, reason, message string) { e.recorder().Event(e.nodeRef, eventType, reason, message) }
	switch {
	case r.Corrupt != nil && r.Corrupt.Path == "":
		// Nothing was moved aside now: an earlier process found the claims
		// on the node not recorded and could not adopt them.
		logger.Error(r.Corrupt.Err, "The claims prepared on this node are not all recorded; they are adopted before anything else is prepared")
		event(corev1.EventTypeWarning, "CheckpointUnreadable",
			fmt.Sprintf("gpudra checkpoint needs the claims on this node adopted: %v", r.Corrupt.Err))
	case r.Corrupt != nil && errors.Is(r.Corrupt.Err, checkpoint.ErrNVIDIACheckpoint):
		logger.Error(r.Corrupt.Err, "Checkpoint of NVIDIA's DRA driver unreadable; moved aside. Claims with a CDI spec on this node, NVIDIA's YAML ones included, are adopted, since they may belong to running pods",
			"movedTo", r.Corrupt.Path)
		event(corev1.EventTypeWarning, "CheckpointUnreadable", unreadableMessage(*r.Corrupt))
	case r.Corrupt != nil:
		logger.Error(r.Corrupt.Err, "Checkpoint unreadable; moved aside. Claims with a CDI spec on this node are adopted, since they may belong to running pods",
			"movedTo", r.Corrupt.Path)
		event(corev1.EventTypeWarning, "CheckpointUnreadable", lostCheckpointMessage(*r.Corrupt))
	case r.NewerVersion != "":
		logger.Error(nil, "Checkpoint was written by a newer gpudra and is left untouched; claims cannot be prepared until that version runs again or the file is removed",
			"version", r.NewerVersion)
		event(corev1.EventTypeWarning, "CheckpointTooNew",
			fmt.Sprintf("gpudra checkpoint has schema version %s, newer than this plugin understands", r.NewerVersion))
	case r.NVIDIA != nil && r.BootIDChanged:
		logger.Info("Checkpoint of NVIDIA's DRA driver is from a previous boot; nothing to adopt",
			"format", r.NVIDIA.Format, "keptAt", r.NVIDIA.KeptAt)
		event(corev1.EventTypeNormal, "NVIDIACheckpointAdopted",
			fmt.Sprintf("gpudra replaced the checkpoint of NVIDIA's DRA driver (%s), which was of a previous boot: no claims adopted; the original is kept at %s", r.NVIDIA.Format, r.NVIDIA.KeptAt))
	case r.NVIDIA != nil:
		logger.Info("Adopted the claims NVIDIA's DRA driver prepared on this node",
			"claims", r.NVIDIA.Claims, "started", r.NVIDIA.Started, "skipped", r.NVIDIA.Skipped,
			"format", r.NVIDIA.Format, "keptAt", r.NVIDIA.KeptAt)
		event(corev1.EventTypeNormal, "NVIDIACheckpointAdopted",
			fmt.Sprintf("gpudra adopted %d claims prepared by NVIDIA's DRA driver (%d only started, rolled back before they are prepared again); its checkpoint is kept at %s",
				r.NVIDIA.Claims, r.NVIDIA.Started, r.NVIDIA.KeptAt))
	case r.BootIDChanged:
		logger.Info("Checkpoint is from a previous boot; its state was discarded")
	case r.Migrated != "":
		logger.Info("Checkpoint migrated to the current schema", "from", r.Migrated)
	}
}

// unreadableMessage is the event message of a checkpoint moved aside
// because it could not be read: whose file it was, where it went and why.
func unreadableMessage(cf checkpoint.CorruptFile) string {
	whose := "gpudra checkpoint"
	if errors.Is(cf.Err, checkpoint.ErrNVIDIACheckpoint) {
		whose = "NVIDIA's DRA driver checkpoint, found where gpudra's belongs,"
	}
	return fmt.Sprintf("%s was unreadable and was moved to %s; the claims with a CDI spec on this node are adopted: %v", whose, cf.Path, cf.Err)
}
