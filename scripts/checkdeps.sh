#!/usr/bin/env bash
# checkdeps.sh: the dependency rules `make lint` enforces with `go list -deps`
# (what a binary links, not what its module mentions):
#   - no production binary (every main package under services/ and cmd/) links test
#     code: pkg/testenv, testcontainers, the stand-ins (vaulttest,
#     time4vpstest), the fake clock, the contract's test cases;
#   - package messages, the wire contract, builds on msgpack and the standard
#     library alone (its module's own test, TestProducerPullsOnlyMsgpack,
#     checks its module graph too).
#   - go-redis is imported only by pkg/stream (the door to Redis: streams,
#     job progress, cancel keys), pkg/service (connects) and pkg/testenv,
#     and by the named exceptions below, each with its reason. Test files
#     (_test.go) may import it: tests inspect Redis directly.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

AP=github.com/autoprovisioner/autoprovisioner
test_code="^($AP/pkg/testenv|$AP/pkg/secrets/vaulttest|$AP/pkg/time4vps/time4vpstest|$AP/pkg/clock/clocktest|$AP/pkg/messages/internal/cases|$AP/pkg/tracing/otlptest|github.com/testcontainers/)"
status=0

mains=$(for d in services/*/ cmd/*/; do go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' "./$d..."; done | sort)
[ -n "$mains" ] || die "no main packages found under services/"
for m in $mains; do
	bad=$(go list -deps "$m" | grep -E "$test_code" || true)
	if [ -n "$bad" ]; then
		printf 'error: %s links test code:\n%s\n' "${m#"$AP"/}" "$bad" >&2
		status=1
	fi
done
step "checkdeps: $(wc -w <<<"$mains") binaries link no test code"

bad=$(cd pkg/messages && go list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' . |
	grep -v -E "^($AP/pkg/messages(/pattern)?|github.com/vmihailenco/.*)$" || true)
if [ -n "$bad" ]; then
	printf 'error: package messages builds more than msgpack:\n%s\n' "$bad" >&2
	status=1
fi
step "checkdeps: package messages builds on msgpack, the standard library and its own pattern package alone"
redis_ok="^$AP/pkg/(stream|service|testenv)$"
# Packages that still import go-redis, each with its reason (package, tab,
# reason). Remove a line once its package goes through pkg/stream.
redis_exceptions="\
$AP/services/deployer/internal/auth	the rate limiter is redis_rate, built on a go-redis client
$AP/services/deployer/internal/deployments	Notifier wakes replicas over Redis pub/sub, which pkg/stream does not offer yet
$AP/services/infra/internal/jobs	Deps names redis.UniversalClient (for stream.NewKeyWatcher): to become stream.Client
$AP/cmd/autoprov	main silences go-redis's own logger (redis.SetLogger)
$AP/cmd/autoprov/internal/cli	operator tool: connects, scans dead-letter streams per node, reads results streams and INFO
$AP/services/deployer/internal/deployertest	test code: the deployer's test environment hands tests a *redis.Client
$AP/services/deployer/internal/fakeinfra	test code: a stand-in for infra that writes results as infra does"
bad=$(go list -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' "$AP/..." |
	awk '/ github.com\/redis\/go-redis\// {print $1}' | grep -v -E "$redis_ok" |
	grep -v -x -F -f <(cut -f1 <<<"$redis_exceptions") || true)
if [ -n "$bad" ]; then
	printf 'error: go-redis imported outside pkg/stream, pkg/service, pkg/testenv (go through pkg/stream, or add an exception with its reason to scripts/checkdeps.sh):\n%s\n' "$bad" >&2
	status=1
fi
step "checkdeps: go-redis imported only by pkg/stream, pkg/service, pkg/testenv and $(wc -l <<<"$redis_exceptions") named exceptions"
exit $status
