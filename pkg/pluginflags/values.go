package pluginflags

import (
	"fmt"
	"net"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation"
)

// maxDriverNameLength is the longest DRA driver name resource.k8s.io
// takes.
const maxDriverNameLength = 63

// ValidateDriverName checks a DRA driver name flag: a DNS subdomain of at
// most 63 characters, as ResourceSlices and DeviceClasses require it.
func ValidateDriverName(flag, name string) error {
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 || len(name) > maxDriverNameLength {
		return fmt.Errorf("--%s %q: must be a DNS subdomain of at most %d characters (lower-case letters, digits, '-' and '.'), e.g. gpu.nvidia.com", flag, name, maxDriverNameLength)
	}
	return nil
}

// ValidateHTTPEndpoint checks an HTTP endpoint flag: empty (no server) or
// [host]:port with a port from 1 to 65535; port 0 would pick a random
// port no probe knows.
func ValidateHTTPEndpoint(flag, endpoint string) error {
	if endpoint == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(endpoint)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 1 || n > 65535) {
			err = fmt.Errorf("port %d", n)
		}
	}
	if err != nil {
		return fmt.Errorf("--%s %q: must be empty or [host]:port with a port from 1 to 65535 (%v)", flag, endpoint, err)
	}
	return nil
}
