package kubelet

import (
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// configuration returns the kubelet's configuration file (a
// KubeletConfiguration) for cfg, port and healthzPort. What the local
// machine imposes is set here, each with its reason; everything else is
// the kubelet's default.
func configuration(cfg Config, port, healthzPort int) ([]byte, error) {
	c := kubeletconfig.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeletconfig.SchemeGroupVersion.String(), Kind: "KubeletConfiguration"},

		// The kubelet API on loopback, with a certificate of the
		// authority kube-apiserver trusts (controlplane's kubelet CA).
		// kube-apiserver shows the kubelets no client certificate (see
		// controlplane.kubeletCA), so the API takes anonymous requests
		// and allows everything: it listens on 127.0.0.1 only.
		Address:            "127.0.0.1",
		Port:               int32(port),
		ReadOnlyPort:       0,
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        ptr.To(int32(healthzPort)),
		TLSCertFile:        cfg.CertFile,
		TLSPrivateKeyFile:  cfg.KeyFile,
		Authentication: kubeletconfig.KubeletAuthentication{
			Anonymous: kubeletconfig.KubeletAnonymousAuthentication{Enabled: ptr.To(true)},
			Webhook:   kubeletconfig.KubeletWebhookAuthentication{Enabled: ptr.To(false)},
		},
		Authorization: kubeletconfig.KubeletAuthorization{Mode: kubeletconfig.KubeletAuthorizationModeAlwaysAllow},

		RegisterWithTaints: cfg.Taints,

		ContainerRuntimeEndpoint: cfg.RuntimeEndpoint,
		ImageServiceEndpoint:     cfg.RuntimeEndpoint,
		PodLogsDir:               cfg.PodLogsDir,
		// Flex volume plugins: the default is a host path under
		// /usr/libexec; this node keeps everything under its root.
		VolumePluginDir: filepath.Join(cfg.RootDir, "volume-plugins"),

		// The machines the local cluster runs on (and CI's) have cgroup
		// v1 and no systemd: the cgroupfs driver, and no QoS or node
		// allocatable cgroups, which the kubelet can only make with
		// controllers a cgroup v1 container host may not delegate (and
		// whose "pods" enforcement needs cgroupsPerQOS).
		FailCgroupV1:           ptr.To(false),
		CgroupDriver:           "cgroupfs",
		CgroupsPerQOS:          ptr.To(false),
		EnforceNodeAllocatable: []string{"none"},
		// A machine with swap must not stop the node: pods get none
		// (the default swap behaviour, NoSwap).
		FailSwapOn: ptr.To(false),
		// No iptables rules: the local cluster runs no kube-proxy, and
		// its pods reach the API server on loopback (host network).
		MakeIPTablesUtilChains: ptr.To(false),
		// The bridge CNI plugin sets up hairpin itself where wanted;
		// "hairpin-veth" writes to /sys for every pod's veth.
		HairpinMode: kubeletconfig.HairpinNone,
		// The images (pause, the test image, gpudra's) are imported
		// into the runtime, not pulled: the kubelet must never collect
		// them, whatever the disk usage.
		ImageGCHighThresholdPercent: ptr.To(int32(100)),
		ImageGCLowThresholdPercent:  ptr.To(int32(99)),
		// No eviction for disk pressure on a shared machine's disk: only
		// memory, at a floor that a machine running the local cluster
		// never reaches. MergeDefaultEvictionSettings is off by default,
		// so the signals not named here have no threshold.
		EvictionHard: map[string]string{"memory.available": "1Mi"},
		// Ephemeral storage accounting needs the runtime's image
		// filesystem statistics for every pod; not needed here.
		LocalStorageCapacityIsolation: ptr.To(false),
		// Faster than the default (1m): the tests and the demo
		// see a restarted container's new state sooner.
		SyncFrequency:             metav1.Duration{Duration: 10 * time.Second},
		NodeStatusUpdateFrequency: metav1.Duration{Duration: 10 * time.Second},
	}
	out, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration of %s: %w", cfg.NodeName, err)
	}
	return out, nil
}
