package install

import (
	"fmt"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// Pod is a workload's pod template as the chart rendered it, and the one
// container of it that the local cluster runs in process.
type Pod struct {
	// Owner names the workload, for messages.
	Owner string
	// Namespace is the pod's.
	Namespace string
	// Template is the rendered pod template.
	Template corev1.PodTemplateSpec
	// Container is the container that runs.
	Container corev1.Container
}

func newPod(owner, namespace string, tmpl corev1.PodTemplateSpec, container string) (*Pod, error) {
	for _, c := range tmpl.Spec.Containers {
		if c.Name == container {
			return &Pod{Owner: owner, Namespace: namespace, Template: tmpl, Container: c}, nil
		}
	}
	return nil, fmt.Errorf("%s has no container %q", owner, container)
}

// hasContainer reports whether tmpl has a container called name.
func hasContainer(tmpl corev1.PodTemplateSpec, name string) bool {
	for _, c := range tmpl.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// ServiceAccount is the pod's ServiceAccount name.
func (p *Pod) ServiceAccount() string {
	if p.Template.Spec.ServiceAccountName == "" {
		return "default"
	}
	return p.Template.Spec.ServiceAccountName
}

// Instance is one pod of the template, placed on a node.
type Instance struct {
	// NodeName and UID are the pod's spec.nodeName and metadata.uid.
	NodeName, UID string
	// HostIP is the pod's status.hostIP.
	HostIP string
	// Volume returns the directory of this process where a volume of the
	// pod lives: for a hostPath volume, the node's directory that stands
	// for the host path; for an emptyDir, one of the pod's.
	Volume func(corev1.Volume) (string, error)
}

// Args returns the container's arguments as its process would get them,
// the subcommand first: $(VAR) references expanded from the container's
// environment as the kubelet expands them (values, and the downward API's
// spec.nodeName, status.hostIP, metadata.uid, metadata.name and metadata.namespace), and
// every absolute path under one of its volume mounts moved to where that
// volume lives for inst. The image's command (/usr/bin/gpudra) is not
// part of them.
func (p *Pod) Args(inst Instance) ([]string, error) {
	env, err := p.env(inst)
	if err != nil {
		return nil, err
	}
	mapping := expansion.MappingFuncFor(env)
	mounts, err := p.mounts(inst)
	if err != nil {
		return nil, err
	}
	args := make([]string, 0, len(p.Container.Args))
	for _, a := range p.Container.Args {
		a = expansion.Expand(a, mapping)
		if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
			a = name + "=" + mapPath(value, mounts)
		}
		args = append(args, a)
	}
	return args, nil
}

// env resolves the container's environment.
func (p *Pod) env(inst Instance) (map[string]string, error) {
	env := map[string]string{}
	for _, e := range p.Container.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expansion.Expand(e.Value, expansion.MappingFuncFor(env))
		case e.ValueFrom.FieldRef != nil:
			switch path := e.ValueFrom.FieldRef.FieldPath; path {
			case "spec.nodeName":
				env[e.Name] = inst.NodeName
			case "status.hostIP":
				if inst.HostIP == "" {
					return nil, fmt.Errorf("%s: env %s: the local cluster gives this pod no host IP", p.Owner, e.Name)
				}
				env[e.Name] = inst.HostIP
			case "metadata.uid":
				env[e.Name] = inst.UID
			case "metadata.namespace":
				env[e.Name] = p.Namespace
			case "metadata.name":
				env[e.Name] = p.Template.GenerateName + inst.UID
			default:
				return nil, fmt.Errorf("%s: env %s: the local cluster does not resolve fieldPath %s", p.Owner, e.Name, path)
			}
		default:
			return nil, fmt.Errorf("%s: env %s: the local cluster resolves only values and fieldRefs", p.Owner, e.Name)
		}
	}
	return env, nil
}

// mount is where a volume mount's path lives in this process.
type mount struct{ container, local string }

func (p *Pod) mounts(inst Instance) ([]mount, error) {
	volumes := map[string]corev1.Volume{}
	for _, v := range p.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	var ms []mount
	for _, m := range p.Container.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("%s: volume mount %s names no volume", p.Owner, m.Name)
		}
		dir, err := inst.Volume(v)
		if err != nil {
			return nil, fmt.Errorf("%s: volume %s: %w", p.Owner, v.Name, err)
		}
		local := dir
		if m.SubPath != "" {
			local = filepath.Join(dir, m.SubPath)
		}
		ms = append(ms, mount{container: filepath.Clean(m.MountPath), local: local})
	}
	return ms, nil
}

// mapPath moves an absolute path under a mount to where the mount lives;
// the longest mount path wins, as the deepest mount shadows the others.
func mapPath(path string, mounts []mount) string {
	if !filepath.IsAbs(path) {
		return path
	}
	clean := filepath.Clean(path)
	best := -1
	for i, m := range mounts {
		if clean == m.container || strings.HasPrefix(clean, strings.TrimSuffix(m.container, "/")+"/") {
			if best < 0 || len(m.container) > len(mounts[best].container) {
				best = i
			}
		}
	}
	if best < 0 {
		return path
	}
	rel, _ := filepath.Rel(mounts[best].container, clean)
	return filepath.Join(mounts[best].local, rel)
}
