// Package slicevalidation holds a test, and nothing else: the
// ResourceSlices the driver publishes, checked by the API server's own
// validation (k8s.io/kubernetes/pkg/apis/resource/validation and the
// declarative rules of resource.k8s.io/v1), which the driver module cannot
// import because the driver must not link an API server.
package slicevalidation
