package computedomain

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// IndexRegistryPrefix starts the name of a clique's index registry, a
// ConfigMap in the clique namespace mapping node names to IMEX indices.
const IndexRegistryPrefix = "gpudra-imex-indices."

// DefaultIndexBackoff is how a node retries taking an index when another
// node changed the registry first: short, jittered waits (nodes of a rack
// start together) growing to Cap, for up to Steps tries, enough that 256
// nodes taking indices at once all get one. Unlike wait.Backoff's own
// stepping, reaching Cap does not end the retries.
var DefaultIndexBackoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 100, Cap: time.Second}

// IndexRegistry hands out each node's IMEX index in a clique: the node's
// place in the peer list (compute-domain-daemon-NNNN), so two nodes must
// never share one, and a node's must never change while it lives (a peer
// renamed under a running daemon breaks the domain, NVIDIA's #1418). An
// index is taken once per node per clique, by an update checked against
// the registry's resourceVersion, and kept: a node that leaves every
// domain keeps its index for when it joins again.
type IndexRegistry struct {
	Client    kubernetes.Interface
	Namespace string
	// MaxNodes bounds the indices: 0..MaxNodes-1 (the peer list's size).
	MaxNodes int
	// Backoff paces retries on conflict; zero is DefaultIndexBackoff.
	Backoff wait.Backoff
}

// RegistryName returns the name of a clique's registry: the clique ID
// lower-cased where that is a valid object name, else a hash of it.
func RegistryName(cliqueID string) string {
	name := IndexRegistryPrefix + strings.ToLower(cliqueID)
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(cliqueID))
	return IndexRegistryPrefix + hex.EncodeToString(sum[:16])
}

// Take returns node's index in cliqueID, taking the lowest free one the
// first time.
func (r *IndexRegistry) Take(ctx context.Context, cliqueID, node string) (int, error) {
	backoff := r.Backoff
	if backoff.Steps == 0 {
		backoff = DefaultIndexBackoff
	}
	name := RegistryName(cliqueID)
	cms := r.Client.CoreV1().ConfigMaps(r.Namespace)
	index := -1
	err := retryConflicts(ctx, backoff, func() error {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Annotations: map[string]string{"resource.nvidia.com/cliqueID": cliqueID}},
				Data:       map[string]string{node: "0"},
			}, metav1.CreateOptions{})
			if err == nil {
				index = 0
			}
			return err
		}
		if err != nil {
			return err
		}
		if v, ok := cm.Data[node]; ok {
			i, err := strconv.Atoi(v)
			if err != nil || i < 0 {
				return fmt.Errorf("ConfigMap %s/%s: node %s has index %q, not a number", r.Namespace, name, node, v)
			}
			index = i
			return nil
		}
		used := map[int]bool{}
		for _, v := range cm.Data {
			if i, err := strconv.Atoi(v); err == nil {
				used[i] = true
			}
		}
		free := -1
		for i := range r.MaxNodes {
			if !used[i] {
				free = i
				break
			}
		}
		if free < 0 {
			return fmt.Errorf("clique %s: all %d IMEX indices are taken (ConfigMap %s/%s); raise --imex-max-nodes", cliqueID, r.MaxNodes, r.Namespace, name)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[node] = strconv.Itoa(free)
		// cm carries the resourceVersion it was read at: a node that took
		// an index in between makes this a conflict, and the loop reads
		// again.
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
		index = free
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("take IMEX index of node %s in clique %s: %w", node, cliqueID, err)
	}
	return index, nil
}

// retryConflicts runs try until it succeeds, fails otherwise than by a
// conflict, b.Steps tries are spent, or ctx ends; between tries it waits
// b.Duration growing by b.Factor up to b.Cap, jittered by b.Jitter.
func retryConflicts(ctx context.Context, b wait.Backoff, try func() error) error {
	delay := b.Duration
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) || attempt >= b.Steps {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(wait.Jitter(delay, b.Jitter)):
		}
		delay = min(time.Duration(float64(delay)*b.Factor), b.Cap)
	}
}
