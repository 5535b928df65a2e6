# gpudra: the two set-up commands of README.md, and a few helpers.
#
# go-nvml is cgo; its header marks NVML calls deprecated that the bindings
# still wrap, which makes gcc print pages of warnings on the first build.
export CGO_ENABLED := 1
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

GO ?= go

.PHONY: demo test build bench fuzz

# What the kubelet plugin would publish on a simulated DGX H100.
demo:
	$(GO) run ./cmd/gpudra inspect --fleet dgx-h100

# Everything CI runs.
test:
	$(GO) vet ./...
	$(GO) test -race ./...

build:
	$(GO) build -o bin/gpudra ./cmd/gpudra

# Benchmarks of Prepare over gRPC and of the checkpoint; not part of test.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 300x ./pkg/plugin/ ./pkg/checkpoint/

# A longer fuzz run of the opaque-config decoder and validator.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecodeValidate -fuzztime 2m ./pkg/config/
