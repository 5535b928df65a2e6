// Package computedomain holds what the ComputeDomain controller and the
// channel kubelet plugin share about ComputeDomain objects: reading them
// through the dynamic client, and the assignment of IMEX channels to
// domains (docs/guides/computedomain.md, "Who assigns channels").
package computedomain
