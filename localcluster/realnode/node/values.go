package node

import (
	"maps"
	"net/url"

	"github.com/gpudra/gpudra/internal/mpsfake"
)

// ChartValues returns the values that install gpudra's chart onto a real
// node of a simulated fleet, to merge over the user's (see MergeValues):
//
//   - simulation.fleet and stateDir: the plugin simulates the fleet's
//     node of the Node's name, its GPUs' state kept across restarts of
//     its container;
//   - every host path under the node directory (the kubelet's plugin
//     directories, the CDI directory, the driver root, the MPS root),
//     which is a shared mount where `/` is private;
//   - hostNetwork, and KUBERNETES_SERVICE_HOST and _PORT naming the API
//     server on loopback: there is no kube-proxy to reach the kubernetes
//     Service from a pod network;
//   - the MPS launcher process: there is no systemd; the fake MPS
//     control lies in the driver root (see installFakeMPS);
//   - VFIO off: the simulated VFIO sysfs lives in the local cluster's
//     process, not on the machine;
//   - image: gpudra's image as imported ([WriteGPUDRAImage]), never pulled;
//   - nodeSelector Label and a toleration of Taint: the DaemonSet runs on
//     real nodes only, the in-process pods serve the simulated ones;
//   - computeDomains.enabled false: the ComputeDomain channel plugin
//     runs on the simulated nodes only (its IMEX daemon is a fake of the
//     local cluster's process).
//
// apiServer is the API server's URL (https://127.0.0.1:<port>).
func ChartValues(l Layout, fleet, apiServer string) (map[string]any, error) {
	u, err := url.Parse(apiServer)
	if err != nil {
		return nil, err
	}
	return map[string]any{
		"image": map[string]any{"repository": ImageRepository, "tag": ImageTag, "pullPolicy": "Never"},
		"simulation": map[string]any{
			"fleet":    fleet,
			"stateDir": l.SimStateDir(),
		},
		"computeDomains": map[string]any{"enabled": false},
		"kubeletPlugin": map[string]any{
			"driverRoot":          l.DriverRoot(),
			"cdiDir":              l.CDIDir(),
			"kubeletPluginsDir":   l.PluginsDir(),
			"kubeletRegistrarDir": l.RegistryDir(),
			"vfio":                "off",
			"mps":                 map[string]any{"root": l.MPSRoot(), "launcher": "process"},
			"hostNetwork":         true,
			"env": []any{
				map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": u.Hostname()},
				map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": u.Port()},
				// The fake MPS daemons live as long as their claims,
				// not the fake's default bound.
				map[string]any{"name": mpsfake.EnvMaxLifetime, "value": "0"},
			},
			"nodeSelector": map[string]any{Label: "true"},
			// The chart's default affinity asks for labels of NVIDIA's
			// feature discovery, which a real node of the local
			// cluster does not have; null removes it, as in helm --set.
			"affinity": nil,
			"tolerations": []any{
				map[string]any{"key": Toleration.Key, "operator": string(Toleration.Operator), "value": Toleration.Value, "effect": string(Toleration.Effect)},
			},
		},
	}, nil
}

// MergeValues returns base with over merged in: maps merge key by key,
// anything else in over replaces base's. Neither is changed.
func MergeValues(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range over {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = MergeValues(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}
