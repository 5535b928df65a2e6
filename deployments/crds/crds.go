// Package crds holds gpudra's CustomResourceDefinitions, the ComputeDomain
// CRDs of NVIDIA's DRA driver (resource.nvidia.com/v1beta1). The YAML files
// in this directory are the one source of truth: embedded here for the
// local cluster and the tests, and copied into the Helm chart as
// deployments/helm/gpudra/files/crds (make chart-files).
package crds

import (
	"embed"
	"io/fs"
)

//go:embed *.yaml
var files embed.FS

// Names of the CRDs, which are also their file names without ".yaml".
const (
	ComputeDomains       = "computedomains.resource.nvidia.com"
	ComputeDomainCliques = "computedomaincliques.resource.nvidia.com"
)

// Files returns the YAML files, by file name.
func Files() fs.FS { return files }

// Read returns the YAML of the CRD called name.
func Read(name string) ([]byte, error) { return files.ReadFile(name + ".yaml") }
