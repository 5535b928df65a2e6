package mps

import (
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Where a claim's MPS directories appear inside its containers. The pipe
// directory goes where MPS looks when CUDA_MPS_PIPE_DIRECTORY is not set,
// so a container that drops the variable still reaches its own daemon (and
// its limits), never another.
const (
	ContainerPipeDir = "/tmp/nvidia-mps"
	ContainerLogDir  = "/var/log/nvidia-mps"
	ContainerShmDir  = "/dev/shm"
)

// ContainerEdits are the CDI edits every container of the daemon's claim
// needs: the pipe directory (read-write: clients create their sockets
// there), the shm directory the servers share with their clients, and the
// log directory read-only, for people debugging from inside the pod. The
// limits are not among them: they are held by the daemon, not by the
// container's environment.
func (d Daemon) ContainerEdits() *cdispec.ContainerEdits {
	rw := []string{"rw", "nosuid", "nodev", "bind"}
	return &cdispec.ContainerEdits{
		Env: []string{
			EnvPipeDirectory + "=" + ContainerPipeDir,
			EnvLogDirectory + "=" + ContainerLogDir,
		},
		Mounts: []*cdispec.Mount{
			{HostPath: d.Dirs.Pipe, ContainerPath: ContainerPipeDir, Options: rw, Type: "bind"},
			{HostPath: d.Dirs.Shm, ContainerPath: ContainerShmDir, Options: rw, Type: "bind"},
			{HostPath: d.Dirs.Log, ContainerPath: ContainerLogDir, Options: []string{"ro", "nosuid", "nodev", "noexec", "bind"}, Type: "bind"},
		},
	}
}
