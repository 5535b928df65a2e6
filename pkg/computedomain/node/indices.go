package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/pkg/computedomain"
)

// IndexRegistryPrefix starts the name of a clique's index registry, a
// ConfigMap in the clique namespace mapping IMEX indices to node names.
const IndexRegistryPrefix = "gpudra-imex-indices."

// DefaultIndexBackoff is how a node retries taking an index when another
// node took the same one first: short, jittered waits growing to Cap, for
// up to Steps tries. Unlike wait.Backoff's own stepping, reaching Cap does
// not end the retries.
var DefaultIndexBackoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 100, Cap: time.Second}

// IndexRegistry hands out each node's IMEX index in a clique: the node's
// place in the peer list (compute-domain-daemon-NNNN), so two nodes must
// never share one, and a node's must never change while it lives (a peer
// renamed under a running daemon breaks the domain, NVIDIA's #1418).
//
// The registry's data maps an index to the node holding it, and each node
// writes only its own key, by server-side apply without force under its
// own field manager: two nodes taking different indices never conflict
// (no resourceVersion is checked), and two taking the same one do, as an
// apply conflict on that key, so the second reads again and takes another.
// Each node starts from a free index of its own (by a hash of its name),
// so that the nodes of a rack starting together mostly take different
// ones at the first try. An update checked against the resourceVersion
// would let one node of all those racing win per round: at 1,000 nodes the
// retries overloaded the API server (docs/guides/computedomain.md, Benchmarks).
// An index is taken once per node per clique and kept: a node that leaves
// every domain keeps its index for when it joins again.
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

// Take returns node's index in cliqueID, taking a free one the first
// time.
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
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		var data map[string]string
		if err == nil {
			data = cm.Data
		}
		held, free, err := indicesOf(data, node, r.MaxNodes)
		if err != nil {
			return fmt.Errorf("ConfigMap %s/%s: %w", r.Namespace, name, err)
		}
		if held >= 0 {
			index = held
			return nil
		}
		if len(free) == 0 {
			return fmt.Errorf("clique %s: all %d IMEX indices are taken (ConfigMap %s/%s); raise --imex-max-nodes", cliqueID, r.MaxNodes, r.Namespace, name)
		}
		pick := pickIndex(node, free)
		apply := corev1ac.ConfigMap(name, r.Namespace).
			WithAnnotations(map[string]string{"resource.nvidia.com/cliqueID": cliqueID}).
			WithData(map[string]string{strconv.Itoa(pick): node})
		// Without Force: a key another node's manager holds is a
		// conflict, and the loop reads again.
		if _, err := cms.Apply(ctx, apply, metav1.ApplyOptions{FieldManager: computedomain.NodeFieldManager(node)}); err != nil {
			return err
		}
		index = pick
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("take IMEX index of node %s in clique %s: %w", node, cliqueID, err)
	}
	return index, nil
}

// indicesOf returns the index node holds in a registry's data (-1 if
// none) and the free indices below maxNodes, in order.
func indicesOf(data map[string]string, node string, maxNodes int) (held int, free []int, err error) {
	held = -1
	used := map[int]bool{}
	for k, v := range data {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 {
			return -1, nil, fmt.Errorf("key %q is not an IMEX index (a number of 0 or more)", k)
		}
		used[i] = true
		if v == node {
			held = i
		}
	}
	for i := range maxNodes {
		if !used[i] {
			free = append(free, i)
		}
	}
	return held, free, nil
}

// pickIndex returns the free index node tries: one of free chosen by a
// hash of its name, so that nodes racing from the same view mostly differ.
func pickIndex(node string, free []int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	return free[h.Sum32()%uint32(len(free))]
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
