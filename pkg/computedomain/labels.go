package computedomain

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/util/validation"
)

// CliqueLabel labels a ComputeDomainClique with its NVLink clique (see
// CliqueLabelValue), so that a node watches only its own clique's objects.
const CliqueLabel = "resource.nvidia.com/computeDomainClique"

// CliqueLabelValue is the CliqueLabel value of a clique: its ID where that
// is a valid label value (a cluster UUID and a number are), else a hash.
func CliqueLabelValue(cliqueID string) string {
	if len(validation.IsValidLabelValue(cliqueID)) == 0 {
		return cliqueID
	}
	sum := sha256.Sum256([]byte(cliqueID))
	return "h" + hex.EncodeToString(sum[:15])
}

// NodeFieldManager is the server-side apply field manager of a node's
// entries in ComputeDomainCliques.
func NodeFieldManager(node string) string { return "gpudra-node-" + node }
