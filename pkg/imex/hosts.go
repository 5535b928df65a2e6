package imex

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
)

// The lines that mark gpudra's block in a hosts file.
const (
	HostsBegin = "# BEGIN gpudra IMEX peers (compute-domain-kubelet-plugin rewrites this block)"
	HostsEnd   = "# END gpudra IMEX peers"
)

// HostsFile is the hosts file through which the daemon resolves its peers'
// names. gpudra owns only the marked block; every other line stays.
type HostsFile struct {
	Path string
}

// Write makes the block map PeerName(index) to the IP of each peer, and
// reports whether the file changed. It rewrites the file in place, not by
// rename: /etc/hosts in a container is a bind mount, which a rename would
// not replace.
func (h HostsFile) Write(peers map[int]string) (changed bool, err error) {
	old, err := os.ReadFile(h.Path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("read hosts file %s: %w", h.Path, err)
	}
	var block bytes.Buffer
	block.WriteString(HostsBegin + "\n")
	for _, i := range slices.Sorted(maps.Keys(peers)) {
		ip := peers[i]
		if net.ParseIP(ip) == nil {
			return false, fmt.Errorf("hosts file %s: peer %d has IP %q, not an IP address", h.Path, i, ip)
		}
		fmt.Fprintf(&block, "%s\t%s\n", ip, PeerName(i))
	}
	block.WriteString(HostsEnd + "\n")
	next := replaceBlock(old, block.Bytes())
	if bytes.Equal(old, next) {
		return false, nil
	}
	if err := os.WriteFile(h.Path, next, 0o644); err != nil {
		return false, fmt.Errorf("write hosts file %s: %w", h.Path, err)
	}
	return true, nil
}

// Peers reads the block back: index by name, for the fake daemon and
// tests.
func (h HostsFile) Peers() (map[string]string, error) {
	data, err := os.ReadFile(h.Path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case line == HostsBegin:
			in = true
		case line == HostsEnd:
			in = false
		case in:
			if f := strings.Fields(line); len(f) >= 2 {
				out[f[1]] = f[0]
			}
		}
	}
	return out, nil
}

// replaceBlock returns data with its marked block replaced by block, or
// with block appended when it has none.
func replaceBlock(data, block []byte) []byte {
	begin := bytes.Index(data, []byte(HostsBegin+"\n"))
	if begin >= 0 {
		if end := bytes.Index(data[begin:], []byte(HostsEnd+"\n")); end >= 0 {
			end += begin + len(HostsEnd) + 1
			out := slices.Clone(data[:begin])
			out = append(out, block...)
			return append(out, data[end:]...)
		}
	}
	out := slices.Clone(data)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, block...)
}
