{{/*
The namespace of the chart's namespaced objects.
*/}}
{{- define "gpudra.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/*
Labels on every object. Component labels come from gpudra.selectorLabels.
*/}}
{{- define "gpudra.labels" -}}
app.kubernetes.io/name: gpudra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
Selector labels of one component; call with (list $ "component").
*/}}
{{- define "gpudra.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: gpudra
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpudra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
Names of the objects. The kubelet plugin's come from deployments/rbac (the
files the local cluster installs too).
*/}}
{{- define "gpudra.kubeletPlugin.name" -}}gpudra-kubelet-plugin{{- end -}}
{{- define "gpudra.devicePlugin.name" -}}gpudra-device-plugin{{- end -}}
{{- define "gpudra.webhook.name" -}}gpudra-webhook{{- end -}}
{{- define "gpudra.resourceSlicePolicy.name" -}}gpudra-resourceslices-own-node{{- end -}}
{{- define "gpudra.computeDomains.controller.name" -}}gpudra-compute-domain-controller{{- end -}}
{{- define "gpudra.computeDomains.kubeletPlugin.name" -}}gpudra-compute-domain-kubelet-plugin{{- end -}}
{{- /* The controller's leader-election Lease, named in its Role. */ -}}
{{- define "gpudra.computeDomains.leaseName" -}}gpudra-compute-domain-controller{{- end -}}

{{/*
A file of deployments/deviceclasses or deployments/rbac (the chart's files/
holds copies of them: make chart-files), parsed, with the chart's labels added and the
driver name substituted. Call with (list $ "files/....yaml"); returns YAML.
*/}}
{{- define "gpudra.sourceObject" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $root.Files.Get $path -}}
{{- if not $text }}{{ fail (printf "chart file %s is missing or empty: files/deviceclasses and files/rbac must hold copies of deployments/deviceclasses and deployments/rbac (make chart-files)" $path) }}{{ end -}}
{{- $text = replace "'gpu.nvidia.com'" (printf "'%s'" $root.Values.driverName) $text -}}
{{- $text = replace "'compute-domain.nvidia.com'" (printf "'%s'" $root.Values.computeDomains.driverName) $text -}}
{{- $obj := fromYaml $text -}}
{{- if hasKey $obj "Error" }}{{ fail (printf "chart file %s: %s" $path $obj.Error) }}{{ end -}}
{{- $labels := merge (dict) ($obj.metadata.labels | default dict) (fromYaml (include "gpudra.labels" $root)) -}}
{{- $_ := set $obj.metadata "labels" $labels -}}
{{- toYaml $obj -}}
{{- end -}}

{{/*
The arguments of `gpudra kubelet-plugin`: every value under kubeletPlugin
that names a flag, and nothing else. The render tests check each flag
against the binary's own flag set.
*/}}
{{- define "gpudra.kubeletPlugin.args" -}}
{{- $p := .Values.kubeletPlugin -}}
- kubelet-plugin
- --driver-name={{ .Values.driverName }}
- --node-name=$(NODE_NAME)
- --pod-uid=$(POD_UID)
- --driver-root={{ $p.driverRoot }}
- --container-driver-root={{ $p.containerDriverRoot }}
{{- with $p.devRoot }}
- --dev-root={{ . }}
{{- end }}
- --sysfs-root={{ $p.sysfsRoot }}
- --proc-root={{ $p.procRoot }}
- --mig-mode={{ $p.migMode }}
- --mig-mode-switching={{ $p.migModeSwitching }}
- --device-metadata={{ $p.deviceMetadata }}
- --sharing={{ $p.sharing }}
- --sharing-default={{ $p.sharingDefault }}
- --vfio={{ $p.vfio }}
{{- with $p.vfioDriver }}
- --vfio-driver={{ . }}
{{- end }}
{{- with $p.vfioGPUs }}
- --vfio-gpus={{ join "," . }}
{{- end }}
- --kube-api-qps={{ $p.kubeAPIQPS }}
- --kube-api-burst={{ $p.kubeAPIBurst }}
- --v={{ $p.logVerbosity }}
- --logging-format={{ $p.logFormat }}
- --http-endpoint=:{{ $p.httpPort }}
- --metrics-path={{ $p.metricsPath }}
- --discovery-interval={{ $p.discoveryInterval }}
- --sweep-interval={{ $p.sweepInterval }}
- --kubelet-call-timeout={{ $p.kubeletCallTimeout }}
- --health-effect={{ $p.health.effect }}
- --health-lost-effect={{ $p.health.lostEffect }}
- --health-ignore-xids={{ $p.health.ignoreXIDs }}
- --mps-root={{ $p.mps.root }}
- --mps-launcher={{ $p.mps.launcher }}
- --nsenter-path={{ $p.mps.nsenterPath }}
- --systemd-run-path={{ $p.mps.systemdRunPath }}
{{- with $p.mps.controlBinary }}
- --mps-control-binary={{ . }}
{{- end }}
{{- with $p.nvidiaSMIPath }}
- --nvidia-smi-path={{ . }}
{{- end }}
- --nvidia-cdi-hook-path={{ $p.nvidiaCDIHookPath }}
- --cdi-dir={{ $p.cdiDir }}
- --plugin-data-dir={{ include "gpudra.kubeletPlugin.dataDir" . }}
- --registrar-dir={{ $p.kubeletRegistrarDir }}
{{- include "gpudra.simulation.args" . }}
{{- end -}}

{{/*
--fleet and --sim-state-dir of the kubelet plugin and its init container's
gpudra inspect: simulated GPUs (values simulation), nothing when
simulation.fleet is empty.
*/}}
{{- define "gpudra.simulation.args" -}}
{{- with .Values.simulation.fleet }}
- --fleet={{ . }}
{{- with $.Values.simulation.stateDir }}
- --sim-state-dir={{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
A fleet file (simulation.fleet an absolute path) is the host's file,
mounted read-only at the same path into each container that simulates
it; a built-in fleet's name needs no mount. Each returns YAML, or nothing.
*/}}
{{- define "gpudra.simulation.fleetFileMount" -}}
{{- if hasPrefix "/" .Values.simulation.fleet }}
- name: sim-fleet
  mountPath: {{ .Values.simulation.fleet }}
  readOnly: true
{{- end }}
{{- end -}}
{{- define "gpudra.simulation.fleetFileVolume" -}}
{{- if hasPrefix "/" .Values.simulation.fleet }}
- name: sim-fleet
  hostPath:
    path: {{ .Values.simulation.fleet }}
    type: File
{{- end }}
{{- end -}}

{{- define "gpudra.kubeletPlugin.dataDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletPluginsDir) .Values.driverName -}}
{{- end -}}

{{/*
The arguments of `gpudra webhook`, in one place because that command's flags
are the newest; the render tests check them against its flag set. Both TLS
modes read the files below; in selfSigned mode the webhook first makes them
in an emptyDir, for the Service's names, and keeps its CA in the
ValidatingWebhookConfiguration's caBundle.
*/}}
{{/*
The CEL expression of the webhook's match condition: the object (a
ResourceClaim, ResourceClaimTemplate or DeviceClass) has an opaque config
whose driver is one of the drivers the webhook checks, the GPU driver's and,
with computeDomains.enabled, the ComputeDomain driver's.
*/}}
{{- define "gpudra.webhook.matchExpression" -}}
{{- $drivers := list .Values.driverName -}}
{{- if .Values.computeDomains.enabled }}{{ $drivers = append $drivers .Values.computeDomains.driverName }}{{ end -}}
{{- $in := printf "exists(c, has(c.opaque) && has(c.opaque.driver) && c.opaque.driver in [%s])" (include "gpudra.quoteCEL" $drivers) -}}
has(object.spec) && (
(has(object.spec.devices) && has(object.spec.devices.config) && object.spec.devices.config.{{ $in }}) ||
(has(object.spec.spec) && has(object.spec.spec.devices) && has(object.spec.spec.devices.config) && object.spec.spec.devices.config.{{ $in }}) ||
(has(object.spec.config) && object.spec.config.{{ $in }}))
{{- end -}}

{{/* Strings as CEL string literals, comma-separated. */}}
{{- define "gpudra.quoteCEL" -}}
{{- $out := list -}}
{{- range . }}{{ $out = append $out (printf "'%s'" .) }}{{ end -}}
{{- join ", " $out -}}
{{- end -}}

{{- define "gpudra.webhook.args" -}}
{{- $w := .Values.webhook -}}
{{- $svc := include "gpudra.webhook.name" . -}}
{{- $ns := include "gpudra.namespace" . -}}
- webhook
- --driver-name={{ .Values.driverName }}
{{- /* Empty: the webhook leaves the ComputeDomain driver's configs alone. */}}
- --compute-domain-driver-name={{ if .Values.computeDomains.enabled }}{{ .Values.computeDomains.driverName }}{{ end }}
- --port={{ $w.port }}
- --v={{ $w.logVerbosity }}
- --logging-format={{ $w.logFormat }}
- --tls-cert-file={{ include "gpudra.webhook.tlsDir" . }}/tls.crt
- --tls-private-key-file={{ include "gpudra.webhook.tlsDir" . }}/tls.key
{{- if eq $w.tls.mode "selfSigned" }}
- --self-signed-dir={{ include "gpudra.webhook.tlsDir" . }}
- --self-signed-hosts={{ printf "%s,%s.%s,%s.%s.svc" $svc $svc $ns $svc $ns }}
- --webhook-configuration-name={{ include "gpudra.webhook.name" . }}
{{- end }}
{{- end -}}

{{/*
The arguments of `gpudra compute-domain-kubelet-plugin`, the DaemonSet's
compute-domains container: every value under computeDomains.kubeletPlugin
and computeDomains that names one of its flags, and the kubeletPlugin
values of the host paths the two containers share. The render tests check
each flag against the binary's own flag set.
*/}}
{{- define "gpudra.computeDomains.kubeletPlugin.args" -}}
{{- $p := .Values.kubeletPlugin -}}
{{- $cd := .Values.computeDomains -}}
{{- $c := $cd.kubeletPlugin -}}
- compute-domain-kubelet-plugin
- --driver-name={{ $cd.driverName }}
- --node-name=$(NODE_NAME)
- --pod-uid=$(POD_UID)
- --driver-root={{ $p.driverRoot }}
- --container-driver-root={{ $p.containerDriverRoot }}
- --proc-root={{ $p.procRoot }}
- --max-channels={{ $cd.maxChannels }}
- --shared-channel={{ $c.sharedChannel }}
- --device-metadata={{ $p.deviceMetadata }}
- --kube-api-qps={{ $c.kubeAPIQPS }}
- --kube-api-burst={{ $c.kubeAPIBurst }}
- --v={{ $c.logVerbosity }}
- --logging-format={{ $c.logFormat }}
- --http-endpoint=:{{ $c.httpPort }}
- --metrics-path={{ $c.metricsPath }}
- --discovery-interval={{ $c.discoveryInterval }}
- --sweep-interval={{ $c.sweepInterval }}
- --kubelet-call-timeout={{ $c.kubeletCallTimeout }}
- --cdi-dir={{ $p.cdiDir }}
- --plugin-data-dir={{ include "gpudra.computeDomains.kubeletPlugin.dataDir" . }}
- --registrar-dir={{ $p.kubeletRegistrarDir }}
{{- with $c.imex }}
- --imex-daemon={{ .daemon }}
- --imex-binary={{ .binary }}
- --imex-ctl={{ .ctl }}
- --imex-launcher={{ .launcher }}
- --imex-nsenter-path={{ .nsenterPath }}
- --imex-systemd-run-path={{ .systemdRunPath }}
- --imex-dir={{ .dir }}
- --imex-hosts-file={{ .hostsFile }}
- --imex-port={{ .port }}
- --imex-cmd-port={{ .cmdPort }}
- --imex-max-nodes={{ .maxNodes }}
- --imex-idle-stop={{ .idleStop }}
{{- end }}
- --clique-namespace={{ include "gpudra.namespace" . }}
- --node-ip=$(NODE_IP)
{{- end -}}

{{- define "gpudra.computeDomains.kubeletPlugin.dataDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletPluginsDir) .Values.computeDomains.driverName -}}
{{- end -}}

{{/*
The arguments of `gpudra compute-domain-controller`. Its cliques and its
Lease live in the chart's namespace, where its Role lets it have them.
*/}}
{{- define "gpudra.computeDomains.controller.args" -}}
{{- $cd := .Values.computeDomains -}}
{{- $c := $cd.controller -}}
{{- $ns := include "gpudra.namespace" . -}}
- compute-domain-controller
- --max-channels={{ $cd.maxChannels }}
- --resync-interval={{ $c.resyncInterval }}
- --clique-namespace={{ $ns }}
- --channel-driver-name={{ $cd.driverName }}
- --leader-elect={{ $c.leaderElection.enabled }}
{{- if $c.leaderElection.enabled }}
- --leader-election-id={{ include "gpudra.computeDomains.leaseName" . }}
- --leader-election-namespace={{ $ns }}
- --leader-election-lease-duration={{ $c.leaderElection.leaseDuration }}
- --leader-election-renew-deadline={{ $c.leaderElection.renewDeadline }}
- --leader-election-retry-period={{ $c.leaderElection.retryPeriod }}
{{- end }}
- --kube-api-qps={{ $c.kubeAPIQPS }}
- --kube-api-burst={{ $c.kubeAPIBurst }}
- --v={{ $c.logVerbosity }}
- --logging-format={{ $c.logFormat }}
{{- end -}}

{{- define "gpudra.webhook.tlsDir" -}}/etc/gpudra/webhook-tls{{- end -}}
{{- define "gpudra.webhook.path" -}}/validate{{- end -}}

{{/*
NetworkPolicy egress every component needs: the API server and DNS.
*/}}
{{- define "gpudra.networkPolicy.egress" -}}
- ports:
  {{- range .Values.networkPolicy.apiServerPorts }}
  - port: {{ . }}
    protocol: TCP
  {{- end }}
- ports:
  - port: 53
    protocol: UDP
  - port: 53
    protocol: TCP
{{- end -}}

{{/*
The node mode label (pkg/nodemode.Label): a node runs gpudra's DRA kubelet
plugin or a device plugin, never both. A node labelled
gpudra.io/mode=device-plugin runs the device-plugin DaemonSet; any other
node (unlabelled, or gpudra.io/mode=dra) runs the DRA one.
*/}}
{{- define "gpudra.modeLabel" -}}gpudra.io/mode{{- end -}}

{{/*
An affinity with the node mode requirement added to each of its required
node selector terms (the terms are ORed, so every one needs it), or to a
term of its own when it has none. Call with (list $affinity $operator):
In for the device plugin, NotIn for the DRA plugin; returns YAML. Whatever
the user's affinity, no node can match both DaemonSets.
*/}}
{{- define "gpudra.modeAffinity" -}}
{{- $affinity := deepCopy (index . 0 | default dict) -}}
{{- $requirement := dict "key" (include "gpudra.modeLabel" .) "operator" (index . 1) "values" (list "device-plugin") -}}
{{- $nodeAffinity := $affinity.nodeAffinity | default dict -}}
{{- $required := $nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $terms := list -}}
{{- range ($required.nodeSelectorTerms | default (list dict)) -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append ($term.matchExpressions | default list) $requirement) -}}
{{- $terms = append $terms $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/*
The arguments of `gpudra device-plugin`: every value under devicePlugin
that names a flag, and the node's paths from kubeletPlugin. The flags that
NVIDIA's config file has too are passed only when set, so that the config
file's flags apply otherwise. The render
tests check them against the binary's own flag parsing.
*/}}
{{- define "gpudra.devicePlugin.args" -}}
{{- $d := .Values.devicePlugin -}}
{{- $p := .Values.kubeletPlugin -}}
- device-plugin
- --driver-name={{ .Values.driverName }}
- --node-name=$(NODE_NAME)
- --driver-root={{ $p.driverRoot }}
- --container-driver-root={{ $p.containerDriverRoot }}
{{- with $p.devRoot }}
- --dev-root={{ . }}
{{- end }}
- --sysfs-root={{ $p.sysfsRoot }}
- --proc-root={{ $p.procRoot }}
{{- with $d.migStrategy }}
- --mig-strategy={{ . }}
{{- end }}
{{- with $d.deviceListStrategy }}
- --device-list-strategy={{ join "," . }}
{{- end }}
{{- with $d.deviceIDStrategy }}
- --device-id-strategy={{ . }}
{{- end }}
{{- if not (kindIs "invalid" $d.passDeviceSpecs) }}
- --pass-device-specs={{ $d.passDeviceSpecs }}
{{- end }}
{{- with $d.cdiAnnotationPrefix }}
- --cdi-annotation-prefix={{ . }}
{{- end }}
- --health-ignore-xids={{ $d.healthIgnoreXIDs }}
- --v={{ $d.logVerbosity }}
- --logging-format={{ $d.logFormat }}
- --device-plugin-dir={{ $d.devicePluginDir }}
- --dra-plugin-data-dir={{ include "gpudra.kubeletPlugin.dataDir" . }}
- --cdi-dir={{ $p.cdiDir }}
- --nvidia-cdi-hook-path={{ $p.nvidiaCDIHookPath }}
- --mps-root={{ $p.mps.root }}
- --mps-launcher={{ $p.mps.launcher }}
- --nsenter-path={{ $p.mps.nsenterPath }}
- --systemd-run-path={{ $p.mps.systemdRunPath }}
{{- with $p.mps.controlBinary }}
- --mps-control-binary={{ . }}
{{- end }}
{{- if $d.config }}
- --config-file={{ include "gpudra.devicePlugin.configDir" . }}/config.yaml
{{- end }}
{{- include "gpudra.simulation.args" . }}
{{- end -}}
{{- define "gpudra.devicePlugin.configDir" -}}/etc/gpudra/device-plugin{{- end -}}
