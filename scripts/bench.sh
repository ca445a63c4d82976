#!/usr/bin/env bash
# bench.sh: run every benchmark of every module against real services and
# print comparable figures (what `make bench` runs). Heavy benchmarks do
# their whole measurement in one iteration, so Go's default -benchtime runs
# them once; BENCH='regexp' selects benchmarks. BENCH_JOBS (default 200)
# sizes BenchmarkJobsVsBare (services/deployer: jobs through the API and 4
# infra replicas against a bare ansible-playbook loop); BenchmarkCheckout
# (services/infra/internal/sources) times a job's source step;
# BENCH_TICK_SIZES (default 100000,1000000) sizes the scheduler's
# BenchmarkTick, printed side by side; BENCH_SCHEDULES (default 10000)
# sizes BenchmarkScheduleLaunch (services/deployer: schedules due at once,
# the real scheduler and the deployer's launcher). -timeout does not cover
# benchmarks (Go stops its alarm before they run): one that can hang needs
# a deadline of its own.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

test_services

modules=$(go work edit -json | sed -n 's/.*"DiskPath": *"\(.*\)".*/\1/p')
for m in $modules; do
	step "go test -bench ${BENCH:-.} $m"
	(cd "$m" && go test -run '^$' -bench "${BENCH:-.}" -benchmem -count 1 -timeout 60m ./...) |
		grep -Ev '^(PASS|ok|\?|goos|goarch|cpu:)' || true
done
