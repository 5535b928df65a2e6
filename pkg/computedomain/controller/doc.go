// Package controller is the ComputeDomain controller (`gpudra
// compute-domain-controller`): it assigns each domain an IMEX channel,
// creates the domain's ResourceClaimTemplate, derives status.nodes and
// Ready from the nodes' ComputeDomainCliques, checks that the domain fits
// an NVLink clique, and cleans up behind a finalizer
// (docs/guides/computedomain.md, "Who assigns channels").
package controller
