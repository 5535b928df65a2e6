// Package cdbench measures ComputeDomains in the local cluster: one
// 18-node domain on the gb200-nvl72 fleet with fake IMEX daemons running
// as processes (BenchmarkComputeDomain18Nodes), and many simulated nodes
// in many domains against a real in-process kube-apiserver, the
// controller and one node.Reporter per node (BenchmarkComputeDomainScale).
// The figures are reported as benchmark metrics, never checked against a
// limit; docs/guides/computedomain.md records them.
package cdbench
