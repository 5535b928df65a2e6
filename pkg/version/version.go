// Package version says which gpudra this binary is: the release version and
// git commit stamped in at build time, or what the Go toolchain recorded
// when nothing was stamped.
//
// A release build sets both with the linker:
//
//	go build -ldflags "-X github.com/gpudra/gpudra/pkg/version.version=v0.1.0 \
//	    -X github.com/gpudra/gpudra/pkg/version.commit=$(git rev-parse HEAD)" ./cmd/gpudra
//
// `make build` and `make image` do this with the repository's VERSION file
// (also the Helm chart's appVersion), and the Dockerfile with its VERSION
// build argument. A binary built
// otherwise (`go install ...@v0.1.0`, `go run`) falls back to the build info:
// the module version, and vcs.revision when the toolchain stamped it (not
// with -buildvcs=false, nor when building from a module archive).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker (-ldflags -X); empty when not set. They are variables,
// not constants, because -X can only set string variables.
var (
	version = ""
	commit  = ""
)

// Unknown stands for a version or commit that neither the build nor the
// build info recorded.
const Unknown = "unknown"

// Info describes a gpudra build. Its JSON form is what `gpudra version -o
// json` prints; the field names are a stable interface for scripts.
type Info struct {
	// Version is the release version (v0.1.0), the module version of a
	// `go install`ed binary, "(devel)" for a local build without a stamped
	// version, or Unknown.
	Version string `json:"version"`
	// Commit is the full git commit the binary was built from, with
	// "-dirty" when the work tree had uncommitted changes and the build
	// info says so, or Unknown.
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Get returns this binary's build information.
func Get() Info {
	info, _ := debug.ReadBuildInfo()
	return resolve(version, commit, info)
}

// resolve prefers the linker-stamped values and falls back to the build
// info, field by field: a build may stamp the version but leave the commit
// to the toolchain.
func resolve(stampedVersion, stampedCommit string, info *debug.BuildInfo) Info {
	out := Info{
		Version:   stampedVersion,
		Commit:    stampedCommit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if info != nil {
		if out.Version == "" {
			out.Version = info.Main.Version
		}
		if out.Commit == "" {
			var revision string
			var modified bool
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					revision = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if revision != "" && modified {
				revision += "-dirty"
			}
			out.Commit = revision
		}
		if info.GoVersion != "" {
			out.GoVersion = info.GoVersion
		}
	}
	if out.Version == "" {
		out.Version = Unknown
	}
	if out.Commit == "" {
		out.Commit = Unknown
	}
	return out
}

// String is the one-line form: "v0.1.0 (commit 0123abc..., go1.26.8, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}

// UserAgentVersion is the version as an HTTP User-Agent product version
// allows it: no spaces or parentheses.
func (i Info) UserAgentVersion() string {
	v := i.Version
	if v == "(devel)" {
		v = "devel"
	}
	if i.Commit != Unknown {
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		v += "+" + c
	}
	return v
}
