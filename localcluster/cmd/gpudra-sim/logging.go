package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// setUpLogging sends klog's output (every component logs through it) to
// the log file, or nowhere: the progress lines and the table are for the
// user, the components' chatter is not.
func setUpLogging(l logging) (func(), error) {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	// one_output: klog writes an error to the error, warning and info
	// outputs, which SetOutput makes one file: each line would be there
	// three times.
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL", "one_output": "true", "v": fmt.Sprint(l.verbosity)} {
		if err := kfs.Set(k, v); err != nil {
			return nil, err
		}
	}
	// The standard logger's too: Helm's chart loader and the webhook's
	// HTTP server log through it.
	if l.file == "" {
		klog.SetOutput(io.Discard)
		log.SetOutput(io.Discard)
		return func() {}, nil
	}
	f, err := os.Create(l.file)
	if err != nil {
		return nil, fmt.Errorf("--log-file: %w", err)
	}
	klog.SetOutput(f)
	log.SetOutput(f)
	return func() { klog.Flush(); f.Close() }, nil
}

// quietStderr runs f with file descriptor 2 pointing to /dev/null. The
// API server's etcd client logs through a zap logger bound to fd 2 at
// init, with no way to turn it down, and complains about every request
// that shutting down cancels.
func quietStderr(f func()) {
	saved, err := syscall.Dup(2)
	if err != nil {
		f()
		return
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		syscall.Close(saved)
		f()
		return
	}
	_ = syscall.Dup2(int(null.Fd()), 2)
	defer func() {
		_ = syscall.Dup2(saved, 2)
		syscall.Close(saved)
		null.Close()
	}()
	f()
}

// progress writes a progress line, with the time, to standard error.
func progress(msg string) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05.000"), msg)
}
