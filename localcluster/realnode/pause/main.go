// Command pause is the local cluster's pod sandbox image program: it holds
// a pod's namespaces until it is told to stop, and reaps the zombies of
// processes that were re-parented to it (PID 1 of a shared PID namespace).
// It is built static (CGO_ENABLED=0) and is the only file of its image
// besides /etc, so the real node needs no registry for its sandboxes.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("gpudra pause")
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-children:
			reap()
		}
	}
}

// reap waits for every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
