// Package controlplane runs a Kubernetes control plane in one process on loopback.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "k8s.io/apiserver/pkg/storage/storagebackend"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)
