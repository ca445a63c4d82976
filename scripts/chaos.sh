#!/usr/bin/env bash
# chaos.sh: the fault-injection run of services/infra (chaos_test.go).
#
#   scripts/chaos.sh          short form (CI): small sizes, CHAOS_PARALLEL (3) scenarios at once
#   scripts/chaos.sh long     issue 10's sizes, CHAOS_REPEAT (default 10) seeded repeats
#
# CHAOS_SEED=s re-runs one seed (printed with every table); CHAOS_SCENARIOS=a,b
# runs only the named scenarios (none kill9 sigterm redis pg2s pg30s dup sentinel).
# Like `make test`, it starts the test profile's Redis and Postgres when
# REDIS_URL/DATABASE_URL are unset (the scenarios that fault Redis or
# Postgres start their own servers).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

test_services

form=${1:-short}
case "$form" in
short)
	parallel=${CHAOS_PARALLEL:-3}
	timeout=${CHAOS_TIMEOUT:-15m}
	;;
long)
	export CHAOS=long CHAOS_REPEAT=${CHAOS_REPEAT:-10}
	parallel=${CHAOS_PARALLEL:-2}
	timeout=${CHAOS_TIMEOUT:-12h}
	;;
*) die "usage: scripts/chaos.sh [short|long]" ;;
esac
step "chaos ($form form): go test -tags chaos -run TestChaos -parallel $parallel in services/infra"
start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
(cd services/infra && go test -tags chaos -run '^TestChaos$' -count=1 -timeout "$timeout" -parallel "$parallel" -v .) >"$log" 2>&1 || status=$?
# The tables and the verdict first; the whole log only when it failed.
grep -E '^(\||chaos table|--- |ok |FAIL|PASS)|CHAOS_SEED=' "$log" || true
if [ "$status" -ne 0 ]; then
	step "chaos failed: full log follows"
	cat "$log"
fi
step "chaos ($form form) took $(($(date +%s) - start))s"
exit "$status"
