#!/usr/bin/env bash
# bench.sh: run every benchmark of every module against real services and
# print comparable figures (what `make bench` runs). Heavy benchmarks do
# their whole measurement in one iteration, so Go's default -benchtime runs
# them once; BENCH='regexp' selects benchmarks.
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
