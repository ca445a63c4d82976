#!/usr/bin/env bash
# vulncheck.sh MODULE...: govulncheck over the given Go modules, for `make lint`.
#
# govulncheck needs its vulnerability database (GOVULNDB, by default the Go
# project's public one). Where it cannot be reached (an offline machine),
# the check is SKIPPED with a clear notice instead of failing the lint for a
# network refusal; VULNCHECK=require makes that an error (for CI with
# network), VULNCHECK=off skips the check. GOVULNDB may also name a mirror or
# a local copy (file:///path), as govulncheck's -db flag takes it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

GOVULNCHECK=${GOVULNCHECK:-golang.org/x/vuln/cmd/govulncheck@v1.9.0}
GOVULNDB=${GOVULNDB:-https://vuln.go.dev}
mode=${VULNCHECK:-auto}

skip() {
	if [ "$mode" = require ]; then
		die "govulncheck: $* (VULNCHECK=require)"
	fi
	printf '\033[1;33m==> govulncheck SKIPPED:\033[0m %s\n' "$*" >&2
	printf '    set GOVULNDB to a reachable mirror or a file:// copy, or VULNCHECK=require to fail instead\n' >&2
	exit 0
}

case $mode in
off)
	step "govulncheck: off (VULNCHECK=off)"
	exit 0
	;;
auto | require) ;;
*) die "VULNCHECK=$mode: want auto, require or off" ;;
esac

# reachable URL: can a TCP connection to the database's host be opened?
# (A cheap probe: govulncheck itself loads every package before it asks.)
reachable() {
	local rest host port
	case $1 in
	file://*) [ -d "${1#file://}" ]; return ;;
	https://*) rest=${1#https://} port=443 ;;
	http://*) rest=${1#http://} port=80 ;;
	*) return 1 ;;
	esac
	host=${rest%%/*}
	if [[ $host == *:* ]]; then
		port=${host##*:} host=${host%:*}
	fi
	timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
}

if ! reachable "$GOVULNDB"; then
	skip "vulnerability database $GOVULNDB cannot be reached from this machine"
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for m in "$@"; do
	step "govulncheck $m"
	if (cd "$m" && go run "$GOVULNCHECK" -db "$GOVULNDB" ./...) 2>&1 | tee "$out"; then
		continue
	fi
	# A network failure half-way (the probe passed, the download did not) is
	# not a finding either.
	if grep -q 'fetching vulnerabilities' "$out" && ! grep -q 'Vulnerability #' "$out"; then
		skip "the vulnerability database $GOVULNDB did not answer"
	fi
	die "govulncheck $m: vulnerabilities found (or it failed): see above"
done
