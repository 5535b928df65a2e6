package controlplane

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// KubernetesVersion returns the version of Kubernetes the control plane
// was built from, as a semantic version with a leading "v" ("v1.37.1"):
// the version of module k8s.io/kubernetes in this program's build, or,
// without it, that of the staging module k8s.io/apiserver (v0.X.Y is
// Kubernetes v1.X.Y).
//
// Kubernetes' own builds stamp the version into
// k8s.io/component-base/version with -ldflags; a `go build` of a program
// that imports the modules does not, and the API server then reports the
// placeholder "v0.0.0-master+$Format:%H$", which kubectl cannot parse.
//
// Test binaries carry no list of dependencies in their build information;
// there the version comes from the path of k8s.io/kubernetes' source files
// compiled into the program, which names the module's version
// (".../k8s.io/kubernetes@v1.37.1/cmd/...", also with -trimpath).
func KubernetesVersion() (string, error) {
	var deps []*debug.Module
	if info, ok := debug.ReadBuildInfo(); ok {
		deps = info.Deps
	}
	v, err := kubernetesVersion(deps)
	if err == nil || len(deps) != 0 {
		return v, err
	}
	file, _ := runtime.FuncForPC(reflect.ValueOf(app.NewConfig).Pointer()).FileLine(0)
	if v, ok := versionFromSourcePath(file, "k8s.io/kubernetes"); ok {
		return kubernetesVersion([]*debug.Module{{Path: "k8s.io/kubernetes", Version: v}})
	}
	return "", fmt.Errorf("%w, and the source path %q names no version", err, file)
}

// versionFromSourcePath returns the version in a path of a module's
// source file in the module cache: the part after "<module>@" up to the
// next slash.
func versionFromSourcePath(file, module string) (string, bool) {
	_, rest, ok := strings.Cut(filepath.ToSlash(file), module+"@")
	if !ok {
		return "", false
	}
	v, _, _ := strings.Cut(rest, "/")
	return v, v != ""
}

// kubernetesVersion finds the Kubernetes version among a build's modules.
func kubernetesVersion(deps []*debug.Module) (string, error) {
	versions := map[string]string{}
	for _, m := range deps {
		v := m.Version
		if m.Replace != nil {
			// A replacement by a local directory has no version.
			v = m.Replace.Version
		}
		if v != "" {
			versions[m.Path] = v
		}
	}
	if v, ok := versions["k8s.io/kubernetes"]; ok {
		sv, err := version.ParseSemantic(v)
		if err != nil {
			return "", fmt.Errorf("module k8s.io/kubernetes: version %q: %w", v, err)
		}
		if sv.Major() != 1 {
			return "", fmt.Errorf("module k8s.io/kubernetes: version %q is not a Kubernetes 1.x version", v)
		}
		return v, nil
	}
	v, ok := versions["k8s.io/apiserver"]
	if !ok {
		return "", errors.New("neither k8s.io/kubernetes nor k8s.io/apiserver is among the program's modules")
	}
	sv, err := version.ParseSemantic(v)
	if err != nil {
		return "", fmt.Errorf("module k8s.io/apiserver: version %q: %w", v, err)
	}
	if sv.Major() != 0 {
		return "", fmt.Errorf("module k8s.io/apiserver: version %q is not a staging version v0.X.Y", v)
	}
	// Staging modules are tagged v0.X.Y for Kubernetes v1.X.Y, with the
	// same pre-release and build parts.
	return "v1" + strings.TrimPrefix(v, "v0"), nil
}

// servedVersion is the API server's effective version with the
// Kubernetes version of the build in what /version serves.
type servedVersion struct {
	basecompatibility.MutableEffectiveVersion
	git *version.Version
}

// newServedVersion wraps ev so that its Info reports gitVersion.
func newServedVersion(ev basecompatibility.MutableEffectiveVersion, gitVersion string) (*servedVersion, error) {
	v, err := version.ParseSemantic(gitVersion)
	if err != nil {
		return nil, fmt.Errorf("parse Kubernetes version %q: %w", gitVersion, err)
	}
	return &servedVersion{MutableEffectiveVersion: ev, git: v}, nil
}

// Info implements [basecompatibility.EffectiveVersion]: the wrapped
// version's information (platform, Go version, emulation and minimum
// compatibility versions) with the build's Kubernetes version. The git
// commit is the placeholder of an unstamped build and says nothing, so
// it is left empty.
func (s *servedVersion) Info() *apimachineryversion.Info {
	info := s.MutableEffectiveVersion.Info()
	if info == nil {
		return nil
	}
	out := *info
	out.GitVersion = "v" + s.git.String()
	out.Major = strconv.FormatUint(uint64(s.git.Major()), 10)
	out.Minor = strconv.FormatUint(uint64(s.git.Minor()), 10)
	if strings.Contains(out.GitCommit, "$Format") {
		out.GitCommit = ""
	}
	return &out
}
