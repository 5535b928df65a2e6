package kubelet

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ContainerLog returns what a container of pod wrote (stdout and stderr,
// in order), from the newest of its log files under PodLogsDir: the files
// the kubelet's own pods/log endpoint reads, without a round trip through
// kube-apiserver. (kube-apiserver reaches this kubelet's API, on 127.0.0.1
// only, although the Node's InternalIP is the machine's address: the
// kubelet refuses a loopback node IP; see controlplane's dialKubelet.)
func (k *Kubelet) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	dir := filepath.Join(k.cfg.PodLogsDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("log of container %s of pod %s/%s: %w", container, pod.Namespace, pod.Name, err)
	}
	newest, newestRestart := "", -1
	for _, e := range entries {
		n, err := strconv.Atoi(strings.TrimSuffix(e.Name(), ".log"))
		if err == nil && strings.HasSuffix(e.Name(), ".log") && n > newestRestart {
			newest, newestRestart = e.Name(), n
		}
	}
	if newest == "" {
		return "", fmt.Errorf("log of container %s of pod %s/%s: no log file in %s", container, pod.Namespace, pod.Name, dir)
	}
	f, err := os.Open(filepath.Join(dir, newest))
	if err != nil {
		return "", err
	}
	defer f.Close()
	return parseCRILog(f)
}

// parseCRILog returns the content of a log in the CRI format: one
// "<time> <stream> <P|F> <content>" per line, P marking a partial line
// continued by the next.
func parseCRILog(f *os.File) (string, error) {
	var out strings.Builder
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		fields := strings.SplitN(s.Text(), " ", 4)
		if len(fields) < 3 {
			continue
		}
		content := ""
		if len(fields) == 4 {
			content = fields[3]
		}
		out.WriteString(content)
		if fields[2] != "P" {
			out.WriteByte('\n')
		}
	}
	return out.String(), s.Err()
}
