package simnode

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// kubeletServer serves the part of the kubelet's HTTPS API that
// kube-apiserver proxies to: /containerLogs, where the simulated node
// tells what each container was given (see containerLog), and /exec,
// /attach, /portForward and /run, which it refuses with a message saying
// why, as it runs no containers.
type kubeletServer struct {
	n    *Node
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// startKubeletServer listens on a free port of 127.0.0.1.
func startKubeletServer(n *Node, tlsConfig *tls.Config) (*kubeletServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &kubeletServer{n: n, ln: ln, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", s.logs)
	for _, p := range []string{"/exec/", "/attach/", "/portForward/", "/run/"} {
		mux.HandleFunc(p, s.noContainers)
	}
	s.srv = &http.Server{
		Handler:           mux,
		TLSConfig:         tlsConfig.Clone(),
		ReadHeaderTimeout: 10 * time.Second,
		// TLS handshake errors and the like go to the node's log, not to
		// the process's standard error.
		ErrorLog: log.New(logWriter{n.logger.WithName("kubelet-api")}, "", 0),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.logger.Error(err, "Kubelet API server stopped")
		}
	}()
	return s, nil
}

func (s *kubeletServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// stop closes the listener and every connection and waits for the server.
func (s *kubeletServer) stop() {
	_ = s.srv.Close()
	<-s.done
}

// logs answers GET /containerLogs/{namespace}/{pod}/{container} with the
// container's log (see containerLog), or, as the kubelet does, with an
// error in plain text, which kube-apiserver passes on as the message. Of the kubelet's query parameters it
// honours tailLines, limitBytes and timestamps (every line carries the
// time the container started, when it was given all of this); follow
// ends with the text, which does not grow; previous finds no earlier
// container, as none was ever restarted.
func (s *kubeletServer) logs(w http.ResponseWriter, r *http.Request) {
	ns, name, ctr := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	st, ok := s.n.loop.podByName(ns, name)
	if !ok {
		http.Error(w, fmt.Sprintf("pod %s/%s is not on node %s", ns, name, s.n.cfg.Name), http.StatusNotFound)
		return
	}
	idx := slices.IndexFunc(st.pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ctr })
	if idx < 0 {
		http.Error(w, fmt.Sprintf("container %q in pod %q is not available", ctr, name), http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	if q.Get("previous") == "true" {
		http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", ctr, name), http.StatusBadRequest)
		return
	}
	devs, started := st.containers[ctr]
	if st.containers == nil || !started {
		why := "ContainerCreating"
		if st.waitMsg != "" {
			why += ": " + st.waitMsg
		}
		http.Error(w, fmt.Sprintf("container %q in pod %q is waiting to start: %s", ctr, name, why), http.StatusBadRequest)
		return
	}
	lines := strings.SplitAfter(containerLog(s.n.cfg.Name, st.pod, ctr, devs), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if v := q.Get("tailLines"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("tailLines %q: want a number of lines, 0 or more", v), http.StatusBadRequest)
			return
		}
		lines = lines[max(0, len(lines)-n):]
	}
	if q.Get("timestamps") == "true" {
		ts := st.pod.CreationTimestamp.Time
		if st.pod.Status.StartTime != nil {
			ts = st.pod.Status.StartTime.Time
		}
		for i := range lines {
			lines[i] = ts.UTC().Format(time.RFC3339Nano) + " " + lines[i]
		}
	}
	text := strings.Join(lines, "")
	if v := q.Get("limitBytes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			http.Error(w, fmt.Sprintf("limitBytes %q: want a number of bytes, 1 or more", v), http.StatusBadRequest)
			return
		}
		text = text[:min(n, len(text))]
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(text))
}

// noContainers refuses exec, attach, port-forward and run: a simulated
// node has no container to enter and no port to forward to.
func (s *kubeletServer) noContainers(w http.ResponseWriter, r *http.Request) {
	what, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if what == "portForward" {
		what = "port-forward"
	}
	writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf(
		"%s is not available: node %s is simulated by gpudra-sim and runs no containers; `kubectl logs POD [-c CONTAINER]` shows what each container was given",
		what, s.n.cfg.Name))
}

// writeStatus answers with a metav1.Status, as the kubelet does, so that
// clients show its message.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
}

// logWriter turns the HTTP server's log lines into the node's log.
type logWriter struct{ logger klog.Logger }

func (l logWriter) Write(p []byte) (int, error) {
	l.logger.V(2).Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
