package plugin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/gpudra/gpudra/pkg/checkpoint"
)

// eventComponent is the source of the Node events gpudra records.
const eventComponent = "gpudra-kubelet-plugin"

func (d *Driver) startEvents() {
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: d.cfg.KubeClient.CoreV1().Events("")})
	d.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventComponent, Host: d.cfg.NodeName})
	d.stopBroadcast = broadcaster.Shutdown
}

// event records an event on this node's Node object, where operators look
// for node-level trouble.
func (d *Driver) event(eventType, reason, message string) {
	if d.recorder != nil {
		d.recorder.Event(d.nodeRef, eventType, reason, message)
	}
}

// reportCheckpoint logs and records what opening the checkpoint found.
func (d *Driver) reportCheckpoint(r checkpoint.OpenReport) {
	switch {
	case r.Corrupt != nil:
		d.logger.Error(r.Corrupt.Err, "Checkpoint unreadable; moved aside. Claims with a CDI spec on this node are adopted, since they may belong to running pods",
			"movedTo", r.Corrupt.Path)
		d.event(corev1.EventTypeWarning, "CheckpointUnreadable",
			fmt.Sprintf("gpudra checkpoint was unreadable and was moved to %s: %v", r.Corrupt.Path, r.Corrupt.Err))
	case r.NewerVersion != "":
		d.logger.Error(nil, "Checkpoint was written by a newer gpudra and is left untouched; claims cannot be prepared until that version runs again or the file is removed",
			"version", r.NewerVersion)
		d.event(corev1.EventTypeWarning, "CheckpointTooNew",
			fmt.Sprintf("gpudra checkpoint has schema version %s, newer than this plugin understands", r.NewerVersion))
	case r.BootIDChanged:
		d.logger.Info("Checkpoint is from a previous boot; its state was discarded")
	case r.Migrated != "":
		d.logger.Info("Checkpoint migrated to the current schema", "from", r.Migrated)
	}
}
