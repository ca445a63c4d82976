#!/usr/bin/env bash
# checkdeps.sh: the dependency rules `make lint` enforces with `go list -deps`
# (what a binary links, not what its module mentions):
#   - no production binary (every main package under services/ and cmd/) links test
#     code: pkg/testenv, testcontainers, the stand-ins (vaulttest,
#     time4vpstest), the fake clock, the contract's test cases;
#   - package messages, the wire contract, builds on msgpack and the standard
#     library alone (its module's own test, TestProducerPullsOnlyMsgpack,
#     checks its module graph too).
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
	grep -v -E "^($AP/pkg/messages|github.com/vmihailenco/.*)$" || true)
if [ -n "$bad" ]; then
	printf 'error: package messages builds more than msgpack:\n%s\n' "$bad" >&2
	status=1
fi
step "checkdeps: package messages builds on msgpack and the standard library alone"
exit $status
