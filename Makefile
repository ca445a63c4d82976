# Makefile: the one entry point for building, running, testing and
# benchmarking the system. `make help` lists the targets.

SHELL := /usr/bin/env bash
GO ?= go
# Go modules of the workspace, as go.work lists them (its one source).
MODULES := $(shell $(GO) work edit -json | sed -n 's/.*"DiskPath": *"\.\/\(.*\)".*/\1/p')
SERVICES := scheduler infra deployer
# Build tags of every binary. grpcnotrace leaves out golang.org/x/net/trace,
# which gRPC (linked in by the OTLP exporter) imports: its init registers
# HTML pages whose templates call methods by name, and one such call anywhere
# makes the linker keep every exported method of every type, which more than
# doubled the binaries and their resident memory (docs/performance.md).
GOTAGS := grpcnotrace
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# govulncheck needs its database over the network; offline, `make lint`
# says it skipped it (VULNCHECK=require fails instead; see scripts/vulncheck.sh).
GOVULNCHECK := golang.org/x/vuln/cmd/govulncheck@v1.9.0

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  \033[1m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build the service binaries into bin/
	@mkdir -p bin
	@for s in $(SERVICES); do \
		echo "==> go build bin/$$s"; \
		(cd services/$$s && $(GO) build -trimpath -tags $(GOTAGS) -o ../../bin/$$s .) || exit 1; \
	done
	@echo "==> go build bin/runguard (infra's play guard, found next to bin/infra)"
	@cd pkg && CGO_ENABLED=0 $(GO) build -trimpath -tags $(GOTAGS) -ldflags='-s -w' -o ../bin/runguard ./ansible/cmd/runguard
	@echo "==> go build bin/notifysink (local Slack webhook receiver for make run)"
	@cd services/scheduler && $(GO) build -trimpath -tags $(GOTAGS) -o ../../bin/notifysink ./cmd/notifysink
	@echo "==> go build bin/webhooksink (local receiver of the deployer's webhooks for make run)"
	@cd services/deployer && $(GO) build -trimpath -tags $(GOTAGS) -o ../../bin/webhooksink ./cmd/webhooksink
	@echo "==> go build bin/autoprov (the operators' command line)"
	@cd cmd/autoprov && $(GO) build -trimpath -tags $(GOTAGS) -o ../../bin/autoprov .
	@echo "==> go build bin/testtarget (local Debian test target for make run)"
	@cd ansible/tests && $(GO) build -trimpath -tags $(GOTAGS) -o ../../bin/testtarget ./cmd/testtarget

.PHONY: run
run: build ## run the whole system locally (installs and starts what it needs under run/)
	@scripts/run.sh

.PHONY: run-compose
run-compose: ## the compose stack in podman from local images: the main job, a deployment, infra scaled to 3
	@scripts/containers.sh run

.PHONY: test
test: ## run every test against real services (starts them when unset); ends with the slowest packages
	@scripts/test.sh

.PHONY: test-unit
test-unit: ## inner loop: go test -short, no services, no -race; never instead of make test
	@scripts/test.sh unit

.PHONY: chaos
chaos: ## fault-injection run, short form (CI): replicas, Redis and Postgres faulted at random; prints the table
	@scripts/chaos.sh short

.PHONY: chaos-long
chaos-long: ## fault-injection run at issue 10's sizes, CHAOS_REPEAT (10) seeded repeats; CHAOS_SEED=s re-runs one
	@scripts/chaos.sh long

.PHONY: bench
bench: ## run the benchmarks and print comparable figures
	@scripts/bench.sh

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, dependency rules, the docs index and govulncheck over every module
	@[ -n "$(MODULES)" ] || { echo "no Go modules found in go.work"; exit 1; }
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do echo "==> vet $$m"; (cd $$m && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...) || exit 1; done
	@echo "==> vet deploy -tags containers (make test's container lane)"; cd deploy && $(GO) vet -tags containers . && $(GO) run $(STATICCHECK) -tags containers .
	@echo "==> vet services/infra -tags chaos (make chaos)"; cd services/infra && $(GO) vet -tags chaos . && $(GO) run $(STATICCHECK) -tags chaos .
	@scripts/checkdeps.sh
	@scripts/checkdocs.sh
	@GOVULNCHECK=$(GOVULNCHECK) scripts/vulncheck.sh $(MODULES)

.PHONY: generate
generate: ## regenerate checked-in generated files (JSON Schemas)
	@for m in $(MODULES); do (cd $$m && $(GO) generate ./...) || exit 1; done

.PHONY: stop
stop: ## stop the local Redis and Postgres of `make run` and `make test`
	@scripts/services.sh stop dev; scripts/services.sh stop test

.PHONY: clean
clean: stop ## stop local services and remove bin/ and run/
	rm -rf bin run
