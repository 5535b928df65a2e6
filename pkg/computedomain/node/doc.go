// Package node is the node side of ComputeDomains: the node's one IMEX
// daemon, supervised for every domain with a channel claim on the node
// ([Daemon]), and the node's entry in each domain's ComputeDomainClique
// ([Reporter]), with the index it takes in its clique ([IndexRegistry]).
package node
