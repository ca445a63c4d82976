#!/usr/bin/env bash
# run.sh: run the whole system locally (what `make run` does).
#
# Installs what is missing from Debian's packages (as root), starts Redis and
# Postgres under run/dev/, starts a local Debian test target (a debootstrap
# root in its own network namespace, with sshd) under run/dev/target,
# writes it into the static inventory run/dev/inventory.yml as server
# "local-target", starts a local Slack webhook receiver (bin/notifysink, log
# in run/dev/logs/webhook.log) and every service from bin/ with its log in
# run/dev/logs/, and runs the main job for real, through the scheduler: it
# detects the server in the inventory, queues it (outbox, then
# provisioner:queue), infra runs ansible/playbooks/setup_server.yml against
# the target, then verify_server.yml, the extra playbook run/dev/rules.yml
# gives the server's group, the result moves the server to READY and the scheduler posts a
# notification to the webhook receiver. Each step, the play's progress and
# the receiver's log are shown. The services keep running until Ctrl-C.
#
# Nothing outside run/ is changed besides installing packages, the package
# and image cache in .cache/, and the target's network namespace (removed on
# exit). The target needs root (namespaces, chroot); without it the services
# run without the demo job.
#
#   RUN_ONCE=1 scripts/run.sh   run the main job once and exit with its status (CI)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

scripts/services.sh start dev
eval "$(scripts/services.sh env dev)"
export REDIS_URL DATABASE_URL
RUN="$ROOT/run/dev"
LOGS="$RUN/logs"
mkdir -p "$LOGS"

# Admin ports and the webhook receiver's address may be moved (another
# checkout's `make run` on the same machine): SCHEDULER_ADMIN, INFRA_ADMIN,
# DEPLOYER_ADMIN, WEBHOOK_ADDR; REDIS_PORT and PG_PORT move the databases.
declare -A ADMIN=([scheduler]=${SCHEDULER_ADMIN:-127.0.0.1:9101} [infra]=${INFRA_ADMIN:-127.0.0.1:9102}
	[deployer]=${DEPLOYER_ADMIN:-127.0.0.1:9103})
PIDS=()
TARGET=""

cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	[ ${#PIDS[@]} -eq 0 ] || step "services stopped (Redis and Postgres keep running; \`make stop\` stops them)"
	if [ -n "$TARGET" ]; then
		bin/testtarget down --dir "$TARGET" >/dev/null 2>&1 || true
		step "local target stopped"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Run directories must be short: they hold unix sockets (108 bytes at most).
RUN_ROOT="$RUN/r"
if [ ${#RUN_ROOT} -gt 32 ]; then
	RUN_ROOT="/tmp/autoprov-runs-$(id -u)"
	step "repository path is long: playbook run directories go to $RUN_ROOT"
fi

SCHEDULER_ENV=("PLAYBOOK_DIR=$ROOT/ansible")
INFRA_ENV=(
	"PLAYBOOK_DIR=$ROOT/ansible"
	"PLAYBOOK_RUN_ROOT=$RUN_ROOT"
	"PLAYBOOK_FACT_CACHE=$RUN/facts"
)

demo=""
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && [ -x bin/testtarget ]; then
	TARGET="$RUN/target"
	bin/testtarget down --dir "$TARGET" >/dev/null 2>&1 || true
	# A fresh root each time: the overlay's upper layer of an earlier run
	# holds what its play changed (root login off, ...).
	if ! grep -q " $TARGET/" /proc/mounts; then rm -rf "$TARGET"; fi
	step "starting the local Debian target (the first time builds and caches its image: about a minute)"
	info=$(bin/testtarget up --detach --dir "$TARGET" 2>"$LOGS/target.log") ||
		{ cat "$LOGS/target.log" >&2; die "the local target did not start (see run/dev/logs/target.log)"; }
	addr=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["addr"])' <<<"$info")
	port=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["port"])' <<<"$info")
	keyfile=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["private_key_file"])' <<<"$info")
	step "target up at $addr:$port (its files live in run/dev/target)"
	# The target shares this machine's kernel: the roles leave kernel
	# settings and swap alone (and check their configuration files), and
	# Docker comes from Debian's mirror, the one the target can reach.
	cat >"$RUN/site-vars.json" <<JSON
{"autoprov_manage_kernel": false, "docker_install_source": "debian",
 "system_tuning_swap_size_mb": 64, "system_tuning_swap_min_free_mb": 256}
JSON
	INFRA_ENV+=(
		"PLAYBOOK_VARS_FILE=$RUN/site-vars.json"
		"SECRETS_FILE_ROOT=$(dirname "$keyfile")"
		"SSH_KEY_REF=file:$(basename "$keyfile")"
	)
	# The scheduler's source: a static inventory (a fresh target each time,
	# so the server is registered anew: no pinned host key, root login).
	cat >"$RUN/inventory.yml" <<YAML
all:
  children:
    local:
      hosts:
        local-target:
          ansible_host: $addr
          ansible_port: $port
          env: local
YAML
	# The scheduler's rules: servers of the group "local" get an extra
	# playbook after setup_server.yml (ProvisionerMessage.playbooks).
	cat >"$RUN/rules.yml" <<YAML
rules:
  - name: verify local servers
    match:
      all:
        - group: local
    playbooks: [verify_server.yml]
YAML
	psql -q "$DATABASE_URL" -v ON_ERROR_STOP=1 \
		-c "DO \$\$ BEGIN IF to_regclass('servers') IS NOT NULL THEN DELETE FROM servers WHERE handle = 'local-target'; END IF; END \$\$"
	WEBHOOK_ADDR=${WEBHOOK_ADDR:-127.0.0.1:9199}
	WEBHOOK_PATH=/services/local/run/webhook
	: >"$LOGS/webhook.log"
	bin/notifysink -addr "$WEBHOOK_ADDR" -path "$WEBHOOK_PATH" -log "$LOGS/webhook.log" 2>>"$LOGS/webhook.err" &
	PIDS+=($!)
	step "local Slack webhook receiver on $WEBHOOK_ADDR (log in run/dev/logs/webhook.log)"
	SCHEDULER_ENV+=(
		"INVENTORY_FILES=$RUN/inventory.yml"
		"RULES_FILE=$RUN/rules.yml"
		"TICK_INTERVAL=2s"
		"HEALTH_INTERVAL=15s"
		"SLACK_WEBHOOK_URL_REF=env:AUTOPROV_SECRET_SLACK_WEBHOOK"
		"AUTOPROV_SECRET_SLACK_WEBHOOK=http://$WEBHOOK_ADDR$WEBHOOK_PATH"
	)
	demo=1
else
	step "not root (or no iproute2): no local target, so no demo job; the services run alone"
fi

for svc in scheduler infra deployer; do
	[ -x "bin/$svc" ] || die "bin/$svc is missing: run \`make build\`"
	step "starting $svc (admin on ${ADMIN[$svc]}, log in run/dev/logs/$svc.log)"
	if [ "$svc" = infra ]; then
		env "${INFRA_ENV[@]}" ADMIN_ADDR=${ADMIN[$svc]} LOG_FORMAT=json "bin/$svc" >>"$LOGS/$svc.log" 2>&1 &
	elif [ "$svc" = scheduler ]; then
		env "${SCHEDULER_ENV[@]}" ADMIN_ADDR=${ADMIN[$svc]} LOG_FORMAT=json "bin/$svc" >>"$LOGS/$svc.log" 2>&1 &
	else
		ADMIN_ADDR=${ADMIN[$svc]} LOG_FORMAT=json "bin/$svc" >>"$LOGS/$svc.log" 2>&1 &
	fi
	PIDS+=($!)
done

for svc in scheduler infra deployer; do
	for i in $(seq 1 300); do
		if curl -fsS "http://${ADMIN[$svc]}/readyz" >/dev/null 2>&1; then
			step "$svc ready"
			break
		fi
		[ "$i" -lt 300 ] || die "$svc did not become ready; see run/dev/logs/$svc.log"
		sleep 0.1
	done
done

status=0
if [ -n "$demo" ]; then
	step "the main job: the scheduler detects local-target in run/dev/inventory.yml, queues it, infra provisions it"
	/usr/bin/python3 scripts/follow-server.py --server local-target --scheduler bin/scheduler \
		--webhook-log "$LOGS/webhook.log" || status=$?
	if [ "$status" -eq 0 ]; then
		step "local-target provisioned: $(psql -tA "$DATABASE_URL" -c \
			"SELECT 'status ' || status || ', ssh user ' || ssh_user FROM servers WHERE handle = 'local-target'")"
	else
		printf '\033[1;31merror:\033[0m the main job did not succeed (exit %s); see run/dev/logs/scheduler.log and infra.log\n' "$status" >&2
	fi
fi

if [ -n "${RUN_ONCE:-}" ]; then
	step "RUN_ONCE set: stopping"
	exit "$status"
fi
step "system running; Ctrl-C stops the services"
wait
