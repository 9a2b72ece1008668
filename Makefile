# onehop. `make demo` shows it working; `make test` runs every test (as root).

GO        ?= go
BIN       ?= bin/agent
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# grpcnotrace: GoBGP pulls gRPC's tracing otherwise (the binary doubles in size).
GOTAGS    ?= grpcnotrace
LDFLAGS   ?= -s -w -X main.version=$(VERSION)
TEST_TIMEOUT ?= 80m
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Each fuzz target runs FUZZTIME (go test fuzzes one target per invocation):
# a number of inputs, not a duration. When a duration runs out, Go 1.26's
# coordinator can report "context deadline exceeded" with no failing input
# (golang/go#75804), which turned a clean run red.
FUZZTIME  ?= 10000x
# A new input is minimized for at most this long (go's default, 60s, can eat a short run).
FUZZMINIMIZETIME ?= 2s
FUZZ_TARGETS ?= ./portal:FuzzBuild ./nft:FuzzRender ./ipvs:FuzzPlan ./config:FuzzConfigFile ./external/config:FuzzConfig

.PHONY: build test unit lint bench bench-e2e fuzz conformance generate

build:
	CGO_ENABLED=0 $(GO) build -tags $(GOTAGS) -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/agent

# Every test: unit, real-kernel (network namespaces), the IPVS VM, the
# end-to-end suite on a real kube-apiserver and the shipped manifests on
# real kubelets (test/node). Needs root; installs the Debian packages it
# needs and builds the Kubernetes binaries once per machine.
test:
	@hack/ci-deps.sh
	ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh conformance)" $(GO) test -tags $(GOTAGS) -count=1 -timeout $(TEST_TIMEOUT) ./...
	@$(MAKE) --no-print-directory fuzz

# Every fuzz target for FUZZTIME. A finding fails the run and is saved under
# the package's testdata/fuzz/, where every plain go test replays it.
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t%%:*} $${t##*:} for $(FUZZTIME)"; \
		$(GO) test -tags $(GOTAGS) -run '^$$' -fuzz "^$${t##*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $${t%%:*}; \
	done

# Upstream Kubernetes's e2e tests of Services and the proxy (every one this
# machine can run, as `make test` runs them) on two real kubelets with
# onehop's shipped DaemonSet (root; test/node). CONFORMANCE_PROXY=kube-proxy
# runs them with kube-proxy, for comparison.
CONFORMANCE_PROXY ?= onehop
conformance:
	@hack/ci-deps.sh
	ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh conformance)" ONEHOP_CONFORMANCE=all ONEHOP_CONFORMANCE_PROXY=$(CONFORMANCE_PROXY) \
		$(GO) test -tags $(GOTAGS) -count=1 -timeout 80m -v -run '^TestConformance$$' ./test/node/

# The differential tester (test/difftest, docs/difftest.md): kube-proxy
# (nftables mode) and onehop on twin namespace clusters, given the same
# random Services; every probe's outcome compared (root). CASES=N cases
# from a random seed it prints, or from SEED=S to replay.
CASES ?= 200
SEED  ?=
.PHONY: difftest
difftest:
	@hack/ci-deps.sh
	ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh node)" ONEHOP_DIFFTEST_CASES=$(CASES) ONEHOP_DIFFTEST_SEED=$(SEED) \
		$(GO) test -tags $(GOTAGS) -count=1 -timeout 12h -v -run '^TestDifferential$$' ./test/difftest/

# The agent under an hour of churn (root; test/soak): a seeded stream of
# SOAK_RATE Service changes per second through a real kube-apiserver, a
# request loop to stable Services that must never fail, and the agent's
# memory, goroutines, descriptors and kernel state sampled every minute.
# Fails on steady growth, or on a table or conntrack state that drifts from
# what the Services need; appends its table, with the machine's load, to
# docs/bench/soak.md. SOAK_SEED replays a stream (each run prints its own).
SOAK_DURATION ?= 1h
SOAK_RATE     ?= 100
SOAK_SEED     ?=
SOAK_TIMEOUT  ?= 3h
.PHONY: soak
soak:
	@hack/ci-deps.sh
	ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh)" ONEHOP_SOAK_DURATION=$(SOAK_DURATION) ONEHOP_SOAK_RATE=$(SOAK_RATE) \
		ONEHOP_SOAK_SEED=$(SOAK_SEED) ONEHOP_SOAK_REPORT=$(CURDIR)/docs/bench/soak.md \
		$(GO) test -tags $(GOTAGS) -count=1 -timeout $(SOAK_TIMEOUT) -v -run '^TestSoak$$' ./test/soak/

# Unit and real-kernel tests only (no control plane, no VM).
unit:
	$(GO) test -tags $(GOTAGS) -count=1 ./portal/... ./dataplane/... ./nft/... ./cmd/... ./external/...

# The IPVS tests (and nft's SCTP test) in a qemu VM, as `make test` runs
# them (root). ONEHOP_VM_RUN=regexp picks tests; ONEHOP_CHURN_SEED and
# ONEHOP_CHURN_SECONDS replay or lengthen the IPVS churn test (test/vm/doc.go).
vm:
	$(GO) test -tags $(GOTAGS) -count=1 -timeout 30m -v ./test/vm/

lint:
	gofmt -l . | (! grep .) || (echo "gofmt needed on the files above"; exit 1)
	$(GO) vet -tags $(GOTAGS) ./...
	$(GO) run $(STATICCHECK) -tags $(GOTAGS) ./...

# Benchmarks against the real kernel (root): full sync of 1k and 10k
# Services x 10 endpoints, one endpoint change at 10k.
bench:
	$(GO) test -tags $(GOTAGS) -run '^$$' -bench . -benchmem -benchtime 3x ./nft/ ./portal/

# The real agent against a real kube-apiserver at 10k and 50k Services x 10
# endpoints (root; test/scale): sync, restarts, endpoint changes, memory,
# CPU and failed connections. Each run appends its table, with the
# machine's load, to docs/bench/e2e.md.
BENCH_E2E_SIZES ?= 10000 50000
# kube-proxy (nftables mode) beside the agent on the same objects, for the
# comparison; empty to leave it out.
BENCH_E2E_KUBEPROXY ?= 1
# From this size up the objects are written before the agents start
# (ONEHOP_SCALE_PRELOAD, test/scale/doc.go): a storm of 100k writes
# with agents and kube-proxy beside it takes hours on a small machine.
BENCH_E2E_PRELOAD_FROM ?= 50000
bench-e2e:
	@set -e; for n in $(BENCH_E2E_SIZES); do \
		ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh node)" ONEHOP_SCALE_SERVICES=$$n ONEHOP_SCALE_REPORT=$(CURDIR)/docs/bench/e2e.md \
			ONEHOP_SCALE_KUBEPROXY=$(BENCH_E2E_KUBEPROXY) ONEHOP_SCALE_PRELOAD="$$([ $$n -ge $(BENCH_E2E_PRELOAD_FROM) ] && echo 1)" \
			$(GO) test -tags $(GOTAGS) -count=1 -timeout 2h -run '^TestEndToEndScale$$' ./test/scale/; \
	done; tail -n 40 docs/bench/e2e.md

# The API server's watch traffic as the cluster grows: one real
# kube-apiserver, many simulated node agents (their informers, no
# dataplane; test/watchscale). Each run appends its table, with the
# machine's load, to docs/bench/watch.md.
BENCH_WATCH_AGENTS ?= 10,50,200,500
.PHONY: bench-watch
bench-watch:
	ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh)" ONEHOP_WATCHSCALE=1 ONEHOP_WATCHSCALE_AGENTS=$(BENCH_WATCH_AGENTS) \
		ONEHOP_WATCHSCALE_REPORT=$(CURDIR)/docs/bench/watch.md \
		$(GO) test -tags $(GOTAGS) -count=1 -timeout 3h -run '^TestWatchScale$$' ./test/watchscale/
	tail -n 20 docs/bench/watch.md

# The targets below drive test/ and hack/: the real control plane, the
# namespace end-to-end suite and the demo.

E2E_TIMEOUT ?= 40m

.PHONY: controlplane e2e demo demo-down

# Build kube-apiserver, etcd and kubectl from their Go modules (once per
# machine; cached under $${ONEHOP_CACHE:-/var/cache/onehop}).
controlplane:
	@hack/controlplane.sh

# End-to-end suite on a real kube-apiserver and network namespaces (root).
e2e:
	@hack/ci-deps.sh
	ONEHOP_CONTROLPLANE_BIN="$$(hack/controlplane.sh)" go test -count=1 -timeout $(E2E_TIMEOUT) ./test/cluster/... ./test/netns/...

# A request through a LoadBalancer IP answered by a pod in one hop (root).
demo:
	@hack/demo.sh up

demo-down:
	@hack/demo.sh down

# The onehop.io/v1alpha1 API's deep copies and CRD manifests, from the
# markers in external/api/v1alpha1 (external/api/v1alpha1's tests fail when
# they are stale).
generate:
	$(GO) tool controller-gen object paths=./external/api/... crd:crdVersions=v1 output:crd:artifacts:config=deploy/base/crds
