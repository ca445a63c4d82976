#!/usr/bin/env bash
# test.sh: run every test of every module against real services.
# When REDIS_URL and DATABASE_URL are unset, the test profile of
# scripts/services.sh provides them (installing Debian packages if needed).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

if [ -z "${REDIS_URL:-}" ] || [ -z "${DATABASE_URL:-}" ]; then
	scripts/services.sh start test
	eval "$(scripts/services.sh env test)"
else
	scripts/services.sh deps
fi
export REDIS_URL DATABASE_URL

tags=""
if docker info >/dev/null 2>&1; then
	tags="-tags=docker" # also run the tests that need a Docker engine (Vault module)
	step "docker engine found: container-only tests enabled"
fi

modules=$(go work edit -json | sed -n 's/.*"DiskPath": *"\(.*\)".*/\1/p')
status=0
for m in $modules; do
	step "go test $m"
	(cd "$m" && go test $tags -race -count=1 -timeout 20m ./...) || status=1
done
exit $status
