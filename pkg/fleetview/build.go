package fleetview

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// Objects are the API objects the model is built from. Any list may be
// empty (not readable, not served); the model then shows less.
type Objects struct {
	// Driver is the DRA driver whose ResourceSlices are shown.
	Driver     string
	Nodes      []*corev1.Node
	Slices     []*resourceapi.ResourceSlice
	Claims     []*resourceapi.ResourceClaim
	Pods       []*corev1.Pod
	TaintRules []*resourceapi.DeviceTaintRule
}

// Build builds the fleet's model. It is a pure function of its input;
// the order of the input lists does not matter.
func Build(in Objects) Fleet {
	b := &builder{
		driver:  in.Driver,
		nodes:   map[string]*Node{},
		devices: map[deviceKey]*deviceRef{},
		pods:    map[string]*corev1.Pod{},
	}
	for _, n := range in.Nodes {
		node := b.node(n.Name)
		node.Ready = readyCondition(n)
		node.Unschedulable = n.Spec.Unschedulable
		for _, t := range n.Spec.Taints {
			node.Taints = append(node.Taints, Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
		}
	}
	for _, p := range in.Pods {
		b.pods[p.Namespace+"/"+p.Name] = p
	}
	fleet := Fleet{Driver: in.Driver}
	// Slices of one node, in name order, so that the GPUs come out the
	// same whatever the order of the informer's store.
	sorted := slices.Clone(in.Slices)
	slices.SortFunc(sorted, func(a, b *resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	gpus := map[string]map[string]*GPU{}
	for _, s := range sorted {
		if s.Spec.Driver != in.Driver || s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
			continue
		}
		fleet.Slices++
		nodeName := *s.Spec.NodeName
		if gpus[nodeName] == nil {
			gpus[nodeName] = map[string]*GPU{}
			b.node(nodeName)
		}
		for i := range s.Spec.Devices {
			b.addDevice(gpus[nodeName], s.Spec.Pool.Name, &s.Spec.Devices[i], in.TaintRules)
		}
	}
	b.addHolders(in.Claims)
	for nodeName, byKey := range gpus {
		node := b.nodes[nodeName]
		for _, g := range byKey {
			finishGPU(g, in.Driver)
			node.GPUs = append(node.GPUs, *g)
		}
		slices.SortFunc(node.GPUs, func(a, b GPU) int { return compareNames(a.Name, b.Name) })
	}
	for _, n := range b.nodes {
		fleet.Nodes = append(fleet.Nodes, *n)
	}
	slices.SortFunc(fleet.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return fleet
}

// deviceKey names a device as an allocation result does.
type deviceKey struct{ pool, device string }

// deviceRef is where a published device's holders go: the full GPU,
// its VFIO device, or the MIG device at an index of gpu.MIG (an index,
// not a pointer: gpu.MIG grows while devices are added).
type deviceRef struct {
	gpu  *GPU
	vfio bool
	mig  int
}

// holders returns the device's holder list.
func (r *deviceRef) holders() *[]Holder {
	switch {
	case r.vfio:
		return &r.gpu.VFIO.Holders
	case r.mig >= 0:
		return &r.gpu.MIG[r.mig].Holders
	default:
		return &r.gpu.Holders
	}
}

type builder struct {
	driver  string
	nodes   map[string]*Node
	devices map[deviceKey]*deviceRef
	pods    map[string]*corev1.Pod
}

func (b *builder) node(name string) *Node {
	n := b.nodes[name]
	if n == nil {
		n = &Node{Name: name}
		b.nodes[name] = n
	}
	return n
}

// addDevice files a published device under its GPU: devices of one GPU
// share its PCI bus ID (gpudra and NVIDIA's driver publish it on full,
// MIG and VFIO devices), else its UUID or parent UUID.
func (b *builder) addDevice(gpus map[string]*GPU, pool string, d *resourceapi.Device, rules []*resourceapi.DeviceTaintRule) {
	typ := stringAttr(d, "type")
	key := cmp.Or(stringAttr(d, "resource.kubernetes.io/pciBusID"), stringAttr(d, "parentUUID"), stringAttr(d, "uuid"), gpuName(d.Name))
	g := gpus[key]
	if g == nil {
		g = &GPU{Name: gpuName(d.Name), Product: stringAttr(d, "productName"), PCIBusID: stringAttr(d, "resource.kubernetes.io/pciBusID")}
		gpus[key] = g
	}
	taints := deviceTaints(d, b.driver, pool, rules)
	g.Taints = append(g.Taints, taints...)
	ref := &deviceRef{gpu: g, mig: -1}
	switch typ {
	case "mig", "vfio":
		dev := Device{Name: d.Name, Type: typ, Profile: stringAttr(d, "profile"), UUID: stringAttr(d, "uuid"), Memory: capacity(d, "memory"), Taints: taints}
		if typ == "vfio" {
			g.VFIO, ref.vfio = &dev, true
		} else {
			ref.mig = len(g.MIG)
			g.MIG = append(g.MIG, dev)
		}
	default:
		g.Name = d.Name
		g.UUID = stringAttr(d, "uuid")
		g.Memory = capacity(d, "memory")
		g.Sharing = stringAttr(d, "sharingMode")
		if p := stringAttr(d, "productName"); p != "" {
			g.Product = p
		}
	}
	if g.UUID == "" {
		g.UUID = stringAttr(d, "parentUUID")
	}
	b.devices[deviceKey{pool, d.Name}] = ref
}

// addHolders puts each allocation result of the driver under the device
// it names, with the pods using the claim and the PodGroups it is
// reserved for.
func (b *builder) addHolders(claims []*resourceapi.ResourceClaim) {
	users := b.claimUsers()
	sorted := slices.Clone(claims)
	slices.SortFunc(sorted, func(a, b *resourceapi.ResourceClaim) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	for _, c := range sorted {
		if c.Status.Allocation == nil {
			continue
		}
		name := c.Namespace + "/" + c.Name
		pods := users[name]
		var groups []string
		for _, r := range c.Status.ReservedFor {
			switch {
			case r.Resource == "pods" && r.APIGroup == "":
				pods = addPod(pods, b.podRef(c.Namespace, r.Name))
			case r.Resource == "podgroups" && r.APIGroup == "scheduling.k8s.io":
				groups = append(groups, c.Namespace+"/"+r.Name)
			}
		}
		slices.Sort(groups)
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != b.driver {
				continue
			}
			ref := b.devices[deviceKey{r.Pool, r.Device}]
			if ref == nil {
				continue
			}
			h := Holder{Claim: name, Request: r.Request, Pods: pods, PodGroups: groups}
			if r.ShareID != nil {
				h.ShareID = string(*r.ShareID)
			}
			for k, q := range r.ConsumedCapacity {
				if h.Consumed == nil {
					h.Consumed = map[string]string{}
				}
				h.Consumed[string(k)] = q.String()
			}
			holders := ref.holders()
			*holders = append(*holders, h)
		}
	}
}

// claimUsers maps claims (namespace/name) to the pods that name them,
// reserved or not yet: a pod waiting for its claim is shown with it.
func (b *builder) claimUsers() map[string][]PodRef {
	users := map[string][]PodRef{}
	for _, p := range b.pods {
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				key := p.Namespace + "/" + *s.ResourceClaimName
				users[key] = addPod(users[key], b.podRef(p.Namespace, p.Name))
			}
		}
		for _, rc := range p.Spec.ResourceClaims {
			if rc.ResourceClaimName != nil {
				key := p.Namespace + "/" + *rc.ResourceClaimName
				users[key] = addPod(users[key], b.podRef(p.Namespace, p.Name))
			}
		}
	}
	return users
}

func (b *builder) podRef(namespace, name string) PodRef {
	ref := PodRef{Name: namespace + "/" + name}
	if p := b.pods[ref.Name]; p != nil {
		ref.Phase = string(p.Status.Phase)
	}
	return ref
}

// addPod adds a pod once, keeping the list sorted.
func addPod(pods []PodRef, p PodRef) []PodRef {
	i, found := slices.BinarySearchFunc(pods, p.Name, func(a PodRef, name string) int { return strings.Compare(a.Name, name) })
	if found {
		return pods
	}
	return slices.Insert(slices.Clone(pods), i, p)
}

// finishGPU drops the dynamic MIG placements nobody holds (a GPU
// publishes dozens; they are counted), sorts, dedupes taints and sets the
// health.
func finishGPU(g *GPU, driver string) {
	kept := g.MIG[:0]
	for _, m := range g.MIG {
		if m.UUID == "" && len(m.Holders) == 0 {
			g.MIGFree++
			continue
		}
		kept = append(kept, m)
	}
	g.MIG = slices.Clip(kept)
	if len(g.MIG) == 0 {
		g.MIG = nil
	}
	slices.SortFunc(g.MIG, func(a, b Device) int { return compareNames(a.Name, b.Name) })
	slices.SortFunc(g.Taints, func(a, b Taint) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Value, b.Value), strings.Compare(a.Effect, b.Effect), strings.Compare(a.Rule, b.Rule))
	})
	g.Taints = slices.Compact(g.Taints)
	g.Health = HealthOK
	for _, t := range g.Taints {
		if strings.HasPrefix(t.Key, driver+"/") {
			g.Health = HealthUnhealthy
		}
	}
}

// deviceTaints are a device's taints in its slice and those of the
// DeviceTaintRules that select it.
func deviceTaints(d *resourceapi.Device, driver, pool string, rules []*resourceapi.DeviceTaintRule) []Taint {
	var out []Taint
	for _, t := range d.Taints {
		out = append(out, Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
	}
	for _, r := range rules {
		if sel := r.Spec.DeviceSelector; sel != nil &&
			(sel.Driver != nil && *sel.Driver != driver || sel.Pool != nil && *sel.Pool != pool || sel.Device != nil && *sel.Device != d.Name) {
			continue
		}
		t := r.Spec.Taint
		out = append(out, Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect), Rule: r.Name})
	}
	return out
}

func readyCondition(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return string(c.Status)
		}
	}
	return string(corev1.ConditionUnknown)
}

func stringAttr(d *resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func capacity(d *resourceapi.Device, name resourceapi.QualifiedName) string {
	if c, ok := d.Capacity[name]; ok {
		return c.Value.String()
	}
	return ""
}

// gpuName derives the GPU's name from a device name of NVIDIA's scheme:
// gpu-vfio-<minor> and gpu-<minor>-mig-... belong to gpu-<minor>.
func gpuName(device string) string {
	if minor, ok := strings.CutPrefix(device, "gpu-vfio-"); ok {
		return "gpu-" + minor
	}
	if gpu, _, ok := strings.Cut(device, "-mig-"); ok {
		return gpu
	}
	return device
}

// compareNames orders names with numbers by value: gpu-2 before gpu-10.
func compareNames(a, b string) int {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Or(cmp.Compare(len(na), len(nb)), strings.Compare(na, nb)); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}
