#!/usr/bin/env bash
# run.sh: run the whole system locally (what `make run` does).
#
# Installs what is missing from Debian's packages (as root), starts Redis and
# Postgres under run/dev/, starts every service binary from bin/ with its log
# in run/dev/logs/, waits until each is ready, and keeps them running until
# Ctrl-C. Nothing outside run/ is changed except installing packages.
#
#   RUN_ONCE=1 scripts/run.sh   start everything, check readiness, stop (CI)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

scripts/services.sh start dev
eval "$(scripts/services.sh env dev)"
export REDIS_URL DATABASE_URL
LOGS="$ROOT/run/dev/logs"
mkdir -p "$LOGS"

declare -A ADMIN=([scheduler]=127.0.0.1:9101 [infra]=127.0.0.1:9102 [deployer]=127.0.0.1:9103)
PIDS=()

stop_services() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	step "services stopped (Redis and Postgres keep running; \`make stop\` stops them)"
}
trap stop_services EXIT
trap 'exit 130' INT TERM

for svc in scheduler infra deployer; do
	[ -x "bin/$svc" ] || die "bin/$svc is missing: run \`make build\`"
	step "starting $svc (admin on ${ADMIN[$svc]}, log in run/dev/logs/$svc.log)"
	ADMIN_ADDR=${ADMIN[$svc]} LOG_FORMAT=json "bin/$svc" >>"$LOGS/$svc.log" 2>&1 &
	PIDS+=($!)
done

for svc in scheduler infra deployer; do
	for i in $(seq 1 100); do
		if curl -fsS "http://${ADMIN[$svc]}/readyz" >/dev/null 2>&1; then
			step "$svc ready"
			break
		fi
		[ "$i" -lt 100 ] || die "$svc did not become ready; see run/dev/logs/$svc.log"
		sleep 0.1
	done
done

if [ -n "${RUN_ONCE:-}" ]; then
	step "RUN_ONCE set: all services ready, stopping"
	exit 0
fi
step "system running; Ctrl-C stops the services"
wait
