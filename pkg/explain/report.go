package explain

// Verdict is the outcome for the target as a whole.
type Verdict string

// The verdicts.
const (
	// VerdictAllocated: every claim is allocated already; whatever keeps
	// the pod pending is not device allocation.
	VerdictAllocated Verdict = "allocated"
	// VerdictFits: the allocator places every pending claim on a node.
	VerdictFits Verdict = "fits"
	// VerdictFails: no node can take every pending claim.
	VerdictFails Verdict = "fails"
)

// Report is an explanation. Its text form is what `gpudra explain` prints;
// its JSON form is for scripts.
type Report struct {
	Kind      Kind   `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Phase and NodeName are the pod's (empty for a claim).
	Phase    string `json:"phase,omitempty"`
	NodeName string `json:"nodeName,omitempty"`
	// SchedulerMessage is the pod's PodScheduled=False message.
	SchedulerMessage string `json:"schedulerMessage,omitempty"`

	Verdict Verdict `json:"verdict"`
	// Summary is the verdict in one sentence.
	Summary string `json:"summary"`
	// Nodes are the nodes tried; ExcludedNodes those the pod cannot go to
	// for reasons other than devices.
	Nodes         []string        `json:"nodes"`
	ExcludedNodes []NodeExclusion `json:"excludedNodes,omitempty"`
	// FitNodes are the nodes where every pending claim fits.
	FitNodes []string `json:"fitNodes,omitempty"`
	// Placement is what the allocator picks on the first node of
	// FitNodes (the scheduler may score another node higher).
	Placement []PlacedDevice `json:"placement,omitempty"`
	// Problems explain a failure that no single request explains: requests
	// or claims that fit alone but not together, constraints, errors the
	// allocator stopped at.
	Problems []string `json:"problems,omitempty"`
	// Warnings are things that may skew the answer (incomplete pools,
	// nodes that could not be listed).
	Warnings []string `json:"warnings,omitempty"`
	// Notices say why nodes' kubelet plugins offer fewer devices than
	// their GPUs hold (their Node events).
	Notices []NodeNotice  `json:"notices,omitempty"`
	Claims  []ClaimReport `json:"claims"`
}

// NodeExclusion is a node the pod cannot use whatever its devices.
type NodeExclusion struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// PlacedDevice is one device of an allocation, made or proposed.
type PlacedDevice struct {
	Claim   string `json:"claim"`
	Request string `json:"request"`
	Node    string `json:"node,omitempty"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

// ClaimReport explains one claim.
type ClaimReport struct {
	Name string `json:"name"`
	// PodClaim is the pod's name for the claim (spec.resourceClaims[].name).
	PodClaim string `json:"podClaim,omitempty"`
	// Template is the ResourceClaimTemplate the claim comes from.
	Template string `json:"template,omitempty"`
	// Created is false when the claim does not exist yet and was built
	// from its template.
	Created bool `json:"created"`
	// Allocated lists the devices of a claim allocated already.
	Allocated []PlacedDevice `json:"allocated,omitempty"`
	// FitNodes are the nodes the claim fits on by itself (pending claims).
	FitNodes    []string           `json:"fitNodes,omitempty"`
	Requests    []RequestReport    `json:"requests,omitempty"`
	Constraints []ConstraintReport `json:"constraints,omitempty"`
}

// Status says whether a request (or constraint) is satisfiable by itself.
type Status string

// The statuses.
const (
	StatusOK    Status = "ok"
	StatusFails Status = "fails"
)

// RequestReport explains one request, or one subrequest of a firstAvailable
// list.
type RequestReport struct {
	// Name is the request's name; a subrequest's is request/subrequest.
	Name        string `json:"name"`
	DeviceClass string `json:"deviceClass,omitempty"`
	// Mode is ExactCount or All; Count is the ExactCount.
	Mode     string            `json:"allocationMode,omitempty"`
	Count    int64             `json:"count,omitempty"`
	Capacity map[string]string `json:"capacity,omitempty"`
	// Status is whether the request can be allocated by itself, on one of
	// FitNodes; Reason says why not (or how it fits).
	Status   Status   `json:"status"`
	Reason   string   `json:"reason"`
	FitNodes []string `json:"fitNodes,omitempty"`
	// Devices counts the devices the request can use.
	Devices *DeviceCounts `json:"devices,omitempty"`
	// Clauses are the selector clauses no candidate device passes, with
	// the values the devices have.
	Clauses []ClauseReport `json:"clauses,omitempty"`
	// Nearest is the device closest to passing the selectors, when none
	// passes them all.
	Nearest *NearestDevice `json:"nearest,omitempty"`
	// Subrequests explain a firstAvailable list, in order; Chosen is the
	// one the allocator would use.
	Subrequests []RequestReport `json:"subrequests,omitempty"`
	Chosen      string          `json:"chosen,omitempty"`
}

// DeviceCounts are the devices a request can use, narrowing step by step.
type DeviceCounts struct {
	// InClass: devices of the DeviceClass in the cluster.
	InClass int `json:"inClass"`
	// Selected: of those, the ones that pass the request's selectors.
	Selected int `json:"selected"`
	// WithCapacity: of those, the ones with the capacity asked for.
	WithCapacity int `json:"withCapacity"`
	// Free: of those, the ones not held by other claims (nor blocked by
	// shared counters or untolerated taints).
	Free int `json:"free"`
	// InUse, CountersUsedUp and Tainted break down WithCapacity - Free.
	InUse          int `json:"inUse,omitempty"`
	CountersUsedUp int `json:"countersUsedUp,omitempty"`
	Tainted        int `json:"tainted,omitempty"`
	// MostOnANode is the most WithCapacity devices one candidate node
	// has (on MostOnANodeName); MostFreeOnANode the most Free.
	MostOnANode         int    `json:"mostOnANode"`
	MostOnANodeName     string `json:"mostOnANodeName,omitempty"`
	MostFreeOnANode     int    `json:"mostFreeOnANode"`
	MostFreeOnANodeName string `json:"mostFreeOnANodeName,omitempty"`
	// NodesWithEnough counts the candidate nodes with enough free devices.
	NodesWithEnough int `json:"nodesWithEnough"`
}

// ClauseReport is one selector clause (a conjunct of a CEL selector) and
// how many candidate devices pass it.
type ClauseReport struct {
	// From is "class <name>" or "request".
	From       string `json:"from"`
	Expression string `json:"expression"`
	// Text is the clause as the report prints it (attr == "value" when it
	// has that shape).
	Text   string `json:"text"`
	Passed int    `json:"passed"`
	Of     int    `json:"of"`
	// Attribute and Values: the attribute the clause reads and the values
	// the candidate devices have.
	Attribute string   `json:"attribute,omitempty"`
	Values    []string `json:"values,omitempty"`
	// Error is the first CEL runtime error the clause gave.
	Error string `json:"error,omitempty"`
}

// NearestDevice is the device that passes the most selector clauses and,
// among those, whose values differ least from what the failing ones want.
type NearestDevice struct {
	Node   string `json:"node,omitempty"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
	// Passes and Of count the selector clauses it passes.
	Passes int `json:"passes"`
	Of     int `json:"of"`
	// Differences are its values of the attributes the failing clauses
	// read, as "name value".
	Differences []string `json:"differences,omitempty"`
	// Failing are the clauses it does not pass.
	Failing []string `json:"failing,omitempty"`
	// State is free, in use, ...
	State string `json:"state"`
}

// ConstraintReport explains a constraint of a claim that cannot be met.
type ConstraintReport struct {
	Kind      string   `json:"kind"`
	Attribute string   `json:"attribute"`
	Requests  []string `json:"requests,omitempty"`
	Status    Status   `json:"status"`
	Reason    string   `json:"reason"`
}
