#!/usr/bin/env bash
# test.sh: run every test of every module against real services.
# When REDIS_URL and DATABASE_URL are unset, the test profile of
# scripts/services.sh provides them (installing Debian packages if needed).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

test_services
# The tests' plays run as autoprov-play: it must read the clone's ansible/.
check_play_user_reads "$ROOT/ansible"

tags=""
if docker info >/dev/null 2>&1; then
	tags="-tags=docker" # also run the tests that need a Docker engine (Vault module)
	step "docker engine found: container-only tests enabled"
fi

modules=$(go work edit -json | sed -n 's/.*"DiskPath": *"\(.*\)".*/\1/p')
# Two lanes: the Ansible content's tests (ansible/tests: real plays against
# Debian targets, mostly waiting on them) run beside the other modules, one
# module after another; TEST_LANES=1 runs everything in one lane. The slow
# lane's output is shown when it ends, so the log stays readable.
slow="./ansible/tests"
lane_log=$(mktemp)
trap 'rm -f "$lane_log"' EXIT
slow_pid=""
if [ "${TEST_LANES:-2}" != 1 ] && [[ " $(echo $modules) " == *" $slow "* ]]; then
	step "go test $slow (in its own lane: its output follows when it ends)"
	(cd "$slow" && go test $tags -race -count=1 -timeout 25m ./...) >"$lane_log" 2>&1 &
	slow_pid=$!
fi

status=0
for m in $modules; do
	[ -n "$slow_pid" ] && [ "$m" = "$slow" ] && continue
	step "go test $m"
	(cd "$m" && go test $tags -race -count=1 -timeout 20m ./...) || status=1
done
if [ -n "$slow_pid" ]; then
	step "waiting for go test $slow"
	wait "$slow_pid" || status=1
	step "go test $slow"
	cat "$lane_log"
fi
exit $status
