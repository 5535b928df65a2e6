// Package computedomain holds what the ComputeDomain controller and the
// node side (the channel kubelet plugin and its IMEX daemon) share about
// ComputeDomain objects: the driver name, the resources and how to read
// them through the dynamic client, the channel a domain holds, and the
// labels and field managers of ComputeDomainCliques. The controller is
// package [controller], the node side package [node]
// (docs/guides/computedomain.md).
package computedomain
