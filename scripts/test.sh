#!/usr/bin/env bash
# test.sh: run every test of every module against real services.
# When REDIS_URL and DATABASE_URL are unset, the test profile of
# scripts/services.sh provides them (installing Debian packages if needed).
#
# `scripts/test.sh unit` (make test-unit) is the inner loop instead: go test
# -short over the modules but ansible/tests, no services, no -race; every
# test that needs Redis, Postgres, sshd or a built binary skips. Never a
# replacement for the full run.
#
# The full run is one `go test -json` over every module's packages with -p
# TEST_P (default 4: on two cores the tests mostly wait on sshd, Postgres and
# plays), and the Ansible content's tests (ansible/tests) in a lane of their
# own beside it; TEST_LANES=1 puts them in the one go test. The log shows
# what a plain go test shows plus the whole output of each failed test, and
# ends with the slowest packages and the total time (docs/testing.md).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

# TEST_MODULES="./pkg ./cmd/autoprov" runs only those modules (default: go.work's).
modules=${TEST_MODULES:-$(go work edit -json | sed -n 's/.*"DiskPath": *"\(.*\)".*/\1/p')}
slow="./ansible/tests"
patterns() { # the go test patterns of the modules, but $1 when given
	for m in $modules; do [ "$m" = "${1:-}" ] || echo "$m/..."; done
}

if [ "${1:-}" = unit ]; then
	step "go test -short (no services; make test runs everything)"
	exec go test -short -count=1 $(patterns "$slow")
fi

test_services
ensure_axe_core # the console's browser test checks every page's accessibility with it
# The tests' plays run as autoprov-play: it must read the clone's ansible/.
check_play_user_reads "$ROOT/ansible"
# Disk: what killed test runs left goes after some hours; a run needs about
# TEST_MIN_FREE_GB for its temp files, Go's build cache and the images
# (lib.sh: ensure_disk_space says what it frees).
sweep_test_leftovers 360
ensure_disk_space "${TEST_MIN_FREE_GB:-10}"

tags=""
if docker info >/dev/null 2>&1; then
	tags="-tags=docker" # also run the tests that need a Docker engine (Vault module)
	step "docker engine found: container-only tests enabled"
fi

# Tests run as root: a /dev/null one of them leaves 0600 fails every
# unprivileged `>/dev/null` of the others (lib.sh).
guard_dev_null
work=$(mktemp -d)
trap 'rm -rf "$work"; dev_null_unguard' EXIT
ls -A "${TMPDIR:-/tmp}" >"$work/tmp-before"
summary="$work/testsummary"
(cd pkg && go build -o "$summary" ./testenv/cmd/testsummary)
start=$(date +%s)

# gotest NAME ARGS...: go test -json ARGS, saved in $work/NAME.json, shown
# readable by testsummary.
gotest() {
	local name=$1
	shift
	go test $tags -race -count=1 -json "$@" 2>&1 | tee "$work/$name.json" | "$summary" stream
}

slow_pid=""
main_patterns=$(patterns "$slow")
if [ "${TEST_LANES:-2}" = 1 ] || [[ " $(echo $modules) " != *" $slow "* ]]; then
	main_patterns=$(patterns)
else
	step "go test $slow (in its own lane: its output follows when it ends)"
	gotest ansible -timeout 40m "$slow/..." >"$work/ansible.log" 2>&1 &
	slow_pid=$!
fi

# The container lane (scripts/containers.sh): the images built with podman
# from local bases and the compose stack running the main job
# (deploy/containers_test.go, build tag containers), beside the Go tests.
# It needs root, like the Ansible tests; CONTAINER_TESTS=off leaves it out
# (said in the log), a module subset (TEST_MODULES) without ./deploy too.
containers_pid=""
if [ "${CONTAINER_TESTS:-on}" = off ]; then
	step "CONTAINER_TESTS=off: the container lane (images, compose stack) is not run"
elif [[ " $(echo $modules) " == *" ./deploy "* ]]; then
	step "container lane: images and the compose stack (its output follows when it ends)"
	(
		t0=$(date +%s)
		scripts/containers.sh images
		echo "==> images ready in $(($(date +%s) - t0))s"
		# -v: the test prints each step with its time since the start.
		cd deploy && go test -tags containers -count=1 -timeout 30m -v -run TestContainers .
	) >"$work/containers.log" 2>&1 &
	containers_pid=$!
fi

status=0
step "go test -p ${TEST_P:-4} over the modules:" $main_patterns
gotest main -p "${TEST_P:-4}" -timeout 35m $main_patterns || status=1
if [ -n "$slow_pid" ]; then
	step "waiting for go test $slow"
	wait "$slow_pid" || status=1
	step "go test $slow"
	cat "$work/ansible.log"
fi
if [ -n "$containers_pid" ]; then
	step "waiting for the container lane"
	wait "$containers_pid" || status=1
	step "container lane (scripts/containers.sh)"
	cat "$work/containers.log"
fi
"$summary" table -n 15 -wall $(( $(date +%s) - start )) "$work"/*.json
# The empty remote tmp dirs of the plays of this run's loopback targets.
remove_target_tmp_dirs -newer "$work/tmp-before"
# Test processes remove what they make in the temp dir; in CI, anything
# left there fails the run (nothing may pile up run after run).
if ! report_test_leftovers "$work/tmp-before" && [ "${CI:-}" = true ]; then
	echo "error: the test run left files in ${TMPDIR:-/tmp} (above)" >&2
	status=1
fi
if [ -n "${TEST_JSON_DIR:-}" ]; then # keep the raw events (CI artefacts)
	mkdir -p "$TEST_JSON_DIR" && cp "$work"/*.json "$TEST_JSON_DIR"/
fi
exit $status
