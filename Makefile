# gpudra: the two set-up commands of README.md, and a few helpers.
#
# go-nvml is cgo; its header marks NVML calls deprecated that the bindings
# still wrap, which makes gcc print pages of warnings on the first build.
export CGO_ENABLED := 1
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

GO ?= go

# What `gpudra version` reports (pkg/version) and the image's tag: the file
# VERSION, which is also the Helm chart's appVersion, so that the chart's
# default image is the one `make image` builds (localcluster/install's
# TestOneVersion checks that they agree). The commit says which build of
# that version a binary is.
VERSION ?= $(shell cat VERSION)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null; [ $$? -ne 1 ] || echo -dirty)
VERSION_PKG := github.com/gpudra/gpudra/pkg/version
LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT)
# The image's name, and its creation time: the commit's, so that one commit
# gives one image digest.
IMAGE ?= ghcr.io/gpudra/gpudra:$(VERSION)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: demo inspect test test-race-e2e test-real-node build image bench bench-prepare fuzz load chaos chaos-real chart-files

# The local cluster: a real control plane with simulated GPU nodes, running
# every example, and the fleet's first node real where the machine allows
# it (docs/real-node.md): the real kubelet, containerd and runc, gpudra from
# the chart as a container of its image, and a probe pod that prints what
# its container sees. Where the machine cannot run a real node (not root,
# no runc or busybox-static, no overlayfs, no cgroup controller) it says
# what is missing and runs with simulated nodes only. The first run
# compiles Kubernetes, the kubelet and containerd (about 15 minutes on 2
# cores); later runs start in about 30 s. DEMO_REAL_NODES=0 leaves the real
# node out.
DEMO_REAL_NODES ?= 1
demo:
	@echo "make demo: compiling gpudra-sim (the first time about 15 minutes on 2 cores, silent; later runs seconds)"
	cd localcluster && $(GO) run ./cmd/gpudra-sim --real-nodes $(DEMO_REAL_NODES)

# What the kubelet plugin would publish on a simulated DGX H100.
inspect:
	$(GO) run ./cmd/gpudra inspect --fleet dgx-h100

# Everything CI runs. The driver module runs with the race detector; the
# local-cluster module (a whole API server, scheduler and controllers in
# process) runs without it, which halves its cold build and test time.
# `make test-race-e2e` runs it with -race.
test:
	$(GO) vet ./...
	$(GO) test -race ./...
	cd deployments/container && $(GO) vet ./... && $(GO) test ./...
	cd localcluster && $(GO) vet ./... && $(GO) test ./...

test-race-e2e:
	cd localcluster && $(GO) test -race ./...

# The real node's container runtime (localcluster/realnode, docs/real-node.md):
# builds containerd, its runc shim, ctr and the CNI plugins from Go modules
# into the user's cache directory (about 3 minutes the first time), starts
# containerd and runs busybox containers with gpudra's CDI devices through
# the CRI. Needs root, runc, busybox-static and overlayfs; not in `make test`.
test-real-node:
	cd localcluster && GPUDRA_REAL_NODE=1 $(GO) test -count=1 -v ./realnode/...

# The Helm chart's files/ (deployments/helm/gpudra/files): copies of the
# YAML of deployments/crds, deployments/deviceclasses and deployments/rbac,
# the one source of those objects. Copies rather than links, which helm
# warns about at every command; localcluster/install's
# TestChartFilesAreCopiesOfTheirSources fails until this is run after a
# change there.
CHART_FILES := deployments/helm/gpudra/files
chart-files:
	@set -e; for d in crds deviceclasses rbac; do \
		rm -rf $(CHART_FILES)/$$d; \
		(cd deployments/$$d && find . -name '*.yaml') | while read -r f; do \
			mkdir -p "$(CHART_FILES)/$$d/$$(dirname "$$f")"; \
			cp "deployments/$$d/$$f" "$(CHART_FILES)/$$d/$$f"; \
		done; \
	done

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/gpudra ./cmd/gpudra

# The container image, without a container daemon (deployments/container):
# gpudra plus the loader, libraries and nsenter of this machine's Debian,
# configured as deployments/container/Dockerfile configures its image.
# Writes _output/image (an OCI image layout) and _output/gpudra-image.tar
# (for docker load, kind load image-archive, ctr image import), tagged
# $(IMAGE); IMAGE=<registry>/gpudra:$(VERSION) names it for your registry.
image:
	$(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o _output/gpudra ./cmd/gpudra
	cd deployments/container && $(GO) run ./cmd/build-image \
		--binary ../../_output/gpudra --layout ../../_output/image \
		--archive ../../_output/gpudra-image.tar --tag $(IMAGE) \
		--version $(VERSION) --commit $(COMMIT) --created $(SOURCE_DATE_EPOCH)

# Benchmarks of Prepare over gRPC and of the checkpoint; not part of test.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 300x ./pkg/plugin/ ./pkg/checkpoint/
	$(GO) test -run '^$$' -bench . -benchtime 300x ./pkg/devicemodel/
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./pkg/deviceplugin/
	cd localcluster && $(GO) test -run '^$$' -bench . -benchtime 300x ./test/preparebench/

# gpudra's own work in one Prepare against the writes it needs, six runs
# for benchstat (docs/performance.md): make bench-prepare > new.txt, then
# benchstat old.txt new.txt.
bench-prepare:
	$(GO) test -run '^$$' -bench 'BenchmarkPrepareOwnWork$$|BenchmarkPrepareWritesFloor$$|BenchmarkPrepareOneClaim$$' \
		-benchtime 300x -count 6 ./pkg/plugin/

# ComputeDomain benchmarks in the local cluster (docs/computedomain.md,
# Benchmarks); not part of test or bench. bench-computedomain: one 18-node
# domain on gb200-nvl72 with fake IMEX daemons, CD_RUNS runs.
# bench-computedomain-scale: CD_NODES simulated nodes in CD_DOMAINS domains
# against a real API server (1,000 nodes take several GiB of memory).
.PHONY: bench-computedomain bench-computedomain-scale
CD_RUNS ?= 3
CD_NODES ?= 1000
CD_DOMAINS ?= 55
bench-computedomain:
	cd localcluster && $(GO) test -run '^$$' -bench ComputeDomain18Nodes -benchtime $(CD_RUNS)x -timeout 30m ./test/cdbench/
bench-computedomain-scale:
	cd localcluster && $(GO) test -run '^$$' -bench ComputeDomainScale -benchtime 1x -timeout 30m ./test/cdbench/ \
		-cdbench.nodes=$(CD_NODES) -cdbench.domains=$(CD_DOMAINS)

# Every decoder of user or on-disk input, fuzzed for FUZZTIME each (make
# fuzz FUZZTIME=30s); `make test` runs their seed corpora as ordinary tests.
# Go fuzzes one target per invocation. New inputs that widen coverage are
# minimized for at most FUZZMINIMIZETIME: with the default of 60 s the
# slower targets (fleet files, checkpoint files) spend most of their time
# minimizing. A crash stops the run; its input is in the package's
# testdata/fuzz/<target>/, which `go test` then runs as a regression test.
FUZZTIME ?= 2m
FUZZMINIMIZETIME ?= 10s
FUZZ_TARGETS := \
	./api/resource/v1beta1:FuzzDecodeMatchesAPIMachinery \
	./pkg/config:FuzzDecodeValidate \
	./pkg/config:FuzzResolve \
	./pkg/checkpoint:FuzzDecode \
	./pkg/checkpoint:FuzzOpen \
	./pkg/checkpoint:FuzzDecodeNVIDIA \
	./pkg/hardware/sim:FuzzParse \
	./pkg/cdi:FuzzRead \
	./pkg/cdi:FuzzValidateAgreesWithTheLibrary \
	./pkg/features/migmode:FuzzRecord \
	./pkg/features/dynamicmig:FuzzRecord \
	./pkg/features/passthrough:FuzzRecord \
	./pkg/features/timeslicing:FuzzRecord \
	./pkg/features/mpsdaemon:FuzzRecord

fuzz:
	@set -e; for target in $(FUZZ_TARGETS); do \
		pkg=$${target%%:*}; name=$${target##*:}; \
		echo "== $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg; \
	done

# The local cluster's load run: 800 pods with one-GPU claims on 100
# simulated 8-GPU nodes, served in alternating rounds by gpudra and by the
# baseline driver (localcluster/baseline); prints the ratios
# (docs/performance.md). Twice: the scheduler searches a node's devices in
# the order of their drivers' names, and the driver whose devices come
# first pays for evaluating the other's claims' selectors on them; the
# baseline's name sorts before gpu.nvidia.com in the first run and after
# it in the second, and the fair ratio is the geometric mean of the two
# runs' ratios. Not part of test.
load:
	cd localcluster && $(GO) run ./cmd/gpudra-sim --load 800 --load-nodes 100
	cd localcluster && $(GO) run ./cmd/gpudra-sim --load 800 --load-nodes 100 --load-baseline-driver sim.baseline.gpudra

# The chaos run (docs/chaos.md): 1,000 trials of random claims on a real
# plugin process whose simulated hardware outlives it, SIGKILLed at random
# moments, its checkpoint lost now and then, handed claims allocated to
# devices it holds, rolled to a second instance, with a 30 s API outage in
# every 100th trial; the invariants are checked after every kill and at
# the end of each trial. About an hour on 2 cores. Not part of test (its short form is: internal/chaos). The
# last line reads "chaos: <N> trials, <M> invariant violations". Replay a
# failing seed with CHAOS_ARGS='-seed <seed> -trials 5'.
chaos:
	$(GO) run ./internal/chaos/cmd/gpudra-chaos $(CHAOS_ARGS)

# The same chaos run against the local cluster's real etcd and
# kube-apiserver (localcluster/test/chaosreal) instead of the driver module's
# in-repo API server: every write of the plugin and the harness is
# validated as in a cluster. Takes gpudra-chaos's flags in CHAOS_ARGS; the
# first run compiles Kubernetes. Not part of test (its short form is:
# localcluster/test/chaosreal). Replay a failing seed with
# CHAOS_ARGS='-seed <seed> -trials 5'.
chaos-real:
	cd localcluster && $(GO) run ./cmd/gpudra-chaos-real $(CHAOS_ARGS)
