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
# the receiver's log are shown. Then the deployer's part: an API key is
# created (printed once), a deployment of a demo project (served from a local
# git repository) is made through the HTTP API, its events are followed live,
# and the commands a user would try next are printed. The services keep
# running until Ctrl-C, and with them everything the run started (the
# webhook receivers, the demo's git server, the target).
#
# The settings the services start with are written to run/dev/autoprov.env
# (secrets as file paths and file: references, never values; each service
# adds only its own Redis user, admin address and signing key): bin/autoprov
# and `bin/deployer keys` read it by default when run from the repository's
# top, so `bin/autoprov status`, `bin/autoprov validate` and
# `bin/deployer keys list` reach this stack as they are. The deployer sends
# its webhooks to a local receiver (bin/webhooksink on 127.0.0.1:9198, log
# in run/dev/logs/deliveries.log) that verifies their signatures.
#
# Nothing outside run/ is changed besides installing packages, the package
# and image cache in .cache/, and the target's network namespace (removed on
# exit). The target needs root (namespaces, chroot); without it the services
# run without the demo job.
#
#   RUN_ONCE=1 scripts/run.sh   run the main job once, then scripts/try-next.sh (every printed
#                               command, the README's and docs' examples, the newcomer's checks),
#                               and exit with the status (CI)
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
# Plays run as the unprivileged autoprov-play user: it must be able to read
# the clone's ansible/ (a clone under /root, or mktemp -d, is private).
check_play_user_reads "$ROOT/ansible"

# Each service logs in to Redis as the ACL user of its role
# (deploy/redis/users.acl): it can touch only its own streams and keys. Its
# URL, password included, reaches it in a file (REDIS_URL_FILE), not in its
# environment.
declare -A REDIS_USER_URL
for svc in admin scheduler infra deployer; do
	REDIS_USER_URL[$svc]=$(scripts/services.sh redis-url dev "$svc")
	(umask 077 && printf '%s\n' "${REDIS_USER_URL[$svc]}" >"$RUN/secrets/redis/$svc.url")
done
(umask 077 && printf '%s\n' "$DATABASE_URL" >"$RUN/secrets/postgres.url")

# Ports may be moved to run two checkouts side by side, e.g.
#   REDIS_PORT=16391 PG_PORT=15441 SCHEDULER_ADMIN_ADDR=127.0.0.1:9111 INFRA_ADMIN_ADDR=127.0.0.1:9112 \
#   DEPLOYER_ADMIN_ADDR=127.0.0.1:9113 API_ADDR=127.0.0.1:8090 WEBHOOK_ADDR=127.0.0.1:9198 RECEIVER_ADDR=127.0.0.1:9196 make run
declare -A ADMIN=([scheduler]=${SCHEDULER_ADMIN_ADDR:-127.0.0.1:9101} [infra]=${INFRA_ADMIN_ADDR:-127.0.0.1:9102}
	[deployer]=${DEPLOYER_ADMIN_ADDR:-127.0.0.1:9103})
API=${API_ADDR:-127.0.0.1:8080}
# The deployer derives each API key's webhook secret from this key.
if [ ! -s "$RUN/webhook-signing.key" ]; then
	(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RUN/webhook-signing.key")
fi
# The deployer's webhooks go to a local receiver that checks their
# signatures: on loopback, which WEBHOOK_ALLOW_CIDRS allows.
RECEIVER_ADDR=${RECEIVER_ADDR:-127.0.0.1:9197}
WEBHOOK_URL="http://$RECEIVER_ADDR/hooks/deploy"
# Settings every service starts with, and what autoprov and `deployer keys`
# read (run/dev/autoprov.env): secrets as files, never values.
COMMON_ENV=(
	"REDIS_URL_FILE=$RUN/secrets/redis/admin.url"
	"DATABASE_URL_FILE=$RUN/secrets/postgres.url"
	"SECRETS_FILE_ROOT=$RUN/secrets"
	"PLAYBOOK_DIR=$ROOT/ansible"
	"API_ADDR=$API"
	"WEBHOOK_SIGNING_KEY_FILE=$RUN/webhook-signing.key"
	"WEBHOOK_ALLOW_CIDRS=${RECEIVER_ADDR%:*}/32"
)
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
	if [ -s "$RUN/gitserve.pid" ]; then
		kill -TERM "$(cat "$RUN/gitserve.pid")" 2>/dev/null || true
		rm -f "$RUN/gitserve.pid"
	fi
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

# Request signing: each producer has its key, made once (run/dev/secrets/
# signing/, 0600): the scheduler signs provisioner:queue requests as
# scheduler-1, the deployer ansible:deploy:queue requests as deployer-1.
# infra knows both (REQUEST_KEYS) and refuses, with a dead letter, any
# request not signed by the producer of its queue (REQUEST_SIGNATURES=require).
SIGNING_DIR="$RUN/secrets/signing"
mkdir -p "$SIGNING_DIR"
for producer in scheduler-1 deployer-1; do
	if [ ! -s "$SIGNING_DIR/$producer.key" ]; then
		(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$SIGNING_DIR/$producer.key")
	fi
done
SCHEDULER_ENV=(
	"REQUEST_SIGNING_KEY_ID=scheduler-1"
	"REQUEST_SIGNING_KEY_FILE=$SIGNING_DIR/scheduler-1.key"
)
DEPLOYER_ENV=(
	"REQUEST_SIGNING_KEY_ID=deployer-1"
	"REQUEST_SIGNING_KEY_FILE=$SIGNING_DIR/deployer-1.key"
	# The console's Queues page reads every stream and replays dead letters
	# as an operator: here the admin Redis user (docs/console.md).
	"CONSOLE_REDIS_URL_FILE=$RUN/secrets/redis/admin.url"
	"CONSOLE_READINESS=scheduler=http://${ADMIN[scheduler]}/readyz,infra=http://${ADMIN[infra]}/readyz"
)
INFRA_ENV=()
COMMON_ENV+=(
	"PLAYBOOK_RUN_ROOT=$RUN_ROOT"
	"PLAYBOOK_FACT_CACHE=$RUN/facts"
	"REQUEST_SIGNATURES=require"
	"REQUEST_KEYS=scheduler-1@provisioner:queue=file:signing/scheduler-1.key,deployer-1@ansible:deploy:queue+ansible:job:queue=file:signing/deployer-1.key"
	# The Ansible job demo fetches its playbook from the local git server
	# over plain http (development only).
	"SOURCES_ALLOW_HTTP=true"
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
	host_addr=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["host_addr"])' <<<"$info")
	target_root=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["root"])' <<<"$info")
	# The demo deployment fetches its project from a git server (smart HTTP)
	# on the target's side of its veth.
	git_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	cat >"$RUN/site-vars.json" <<JSON
{"autoprov_manage_kernel": false, "docker_install_source": "debian",
 "system_tuning_swap_size_mb": 64, "system_tuning_swap_min_free_mb": 256,
 "project_deploy_git_base_url": "http://$host_addr:$git_port", "project_deploy_wait_timeout": 30}
JSON
	# The target's SSH key, under SECRETS_FILE_ROOT (run/dev/secrets).
	mkdir -p "$RUN/secrets/ssh"
	install -m 0600 "$keyfile" "$RUN/secrets/ssh/local-target.key"
	COMMON_ENV+=(
		# The playbooks run as the unprivileged user scripts/services.sh
		# created: they cannot read infra's files, memory or environment.
		"PLAYBOOK_USER=autoprov-play"
		"PLAYBOOK_VARS_FILE=$RUN/site-vars.json"
	)
	# The Ansible job demo's repository is on this host's end of the
	# target's veth: an address of this host, which infra refuses for a
	# repository unless allowed (targets are not allowed there).
	INFRA_ENV+=("SOURCES_ALLOW_NETWORKS=$host_addr/32")
	# The scheduler's source: a static inventory (a fresh target each time,
	# so the server is registered anew: no pinned host key, root login).
	# The server belongs to the demo's project (servers of no project are
	# reachable to fleet-wide keys only: docs/security.md), with a key of
	# its own, which a job of that project may use (infra's SSH_KEY_REF is
	# never lent to a job).
	DEMO_PROJECT=5eed0000-0000-4000-8000-000000000031
	cat >"$RUN/inventory.yml" <<YAML
all:
  children:
    local:
      hosts:
        local-target:
          ansible_host: $addr
          ansible_port: $port
          env: local
          autoprov_projects: $DEMO_PROJECT
          autoprov_ssh_key_ref: file:ssh/local-target.key
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
	(umask 077 && printf '%s' "http://$WEBHOOK_ADDR$WEBHOOK_PATH" >"$RUN/secrets/slack-webhook.url")
	COMMON_ENV+=(
		"INVENTORY_FILES=$RUN/inventory.yml"
		"RULES_FILE=$RUN/rules.yml"
		"TICK_INTERVAL=2s"
		"HEALTH_INTERVAL=15s"
		"SLACK_WEBHOOK_URL_REF=file:slack-webhook.url"
	)
	demo=1
else
	step "not root (or no iproute2): no local target, so no demo job; the services run alone"
fi

# The deployer's webhook receiver: it verifies each delivery's signature
# with the secrets in run/dev/secrets/webhook.secret (the demo's key's).
: >>"$LOGS/deliveries.log"
(umask 077 && : >>"$RUN/secrets/webhook.secret")
bin/webhooksink -addr "$RECEIVER_ADDR" -secrets "$RUN/secrets/webhook.secret" -dir "$RUN/webhooks" \
	-log "$LOGS/deliveries.log" 2>>"$LOGS/webhooksink.err" &
PIDS+=($!)
step "local receiver of the deployer's webhooks on $RECEIVER_ADDR (verifies signatures; log in run/dev/logs/deliveries.log)"

# The services' shared settings, for the operators' tools too.
{
	echo "# Written by make run (scripts/run.sh): the settings its services start with;"
	echo "# each adds its own REDIS_URL_FILE, ADMIN_ADDR and request signing key."
	echo "# Secrets are files (_FILE, file: references under SECRETS_FILE_ROOT), never values."
	echo "# bin/autoprov and \`bin/deployer keys\` read this file from the repository's top."
	for kv in "${COMMON_ENV[@]}"; do
		printf "%s='%s'\n" "${kv%%=*}" "${kv#*=}"
	done
} >"$RUN/autoprov.env"
step "settings in run/dev/autoprov.env (bin/autoprov and bin/deployer keys read it from here)"

# Where this run's lines start in each log (they accumulate across runs).
declare -A LOG_START
for svc in scheduler infra deployer; do
	LOG_START[$svc]=$(($({ wc -l <"$LOGS/$svc.log"; } 2>/dev/null || echo 0) + 1))
done
for svc in scheduler infra deployer; do
	[ -x "bin/$svc" ] || die "bin/$svc is missing: run \`make build\`"
	step "starting $svc (admin on ${ADMIN[$svc]}, log in run/dev/logs/$svc.log)"
	declare -n own="${svc^^}_ENV"
	# The shared settings, then the service's own (its Redis user last).
	env -u REDIS_URL -u DATABASE_URL "${COMMON_ENV[@]}" "${own[@]}" REDIS_URL_FILE="$RUN/secrets/redis/$svc.url" \
		ADMIN_ADDR=${ADMIN[$svc]} LOG_FORMAT=json "bin/$svc" >>"$LOGS/$svc.log" 2>&1 &
	PIDS+=($!)
	unset -n own
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

if [ -n "$demo" ] && [ "$status" -eq 0 ]; then
	WEBHOOK_URL=$WEBHOOK_URL scripts/demo-deploy.sh "$API" "$RUN" "$addr" "$host_addr" "$git_port" "$target_root" "$DEMO_PROJECT" || status=$?
	[ "$status" -eq 0 ] || printf '\033[1;31merror:\033[0m the demo deployment did not succeed (exit %s); see run/dev/logs/\n' "$status" >&2
fi

# An Ansible job (issue 23): a playbook from the demo's git server on
# local-target, through POST /api/v1/jobs (skipped when infra has no job
# consumer).
if [ -n "$demo" ] && [ "$status" -eq 0 ]; then
	scripts/demo-ansible-job.sh "$API" "$RUN" "$addr" "$host_addr" "$git_port" "$target_root" "$DEMO_PROJECT" || status=$?
	[ "$status" -eq 0 ] || printf '\033[1;31merror:\033[0m the demo Ansible job did not succeed (exit %s); see run/dev/logs/\n' "$status" >&2
fi

# A command the shipped Redis ACL refuses is a bug (a role missing a key
# pattern, or a service using a key it should not): say so.
for svc in scheduler infra deployer; do
	if tail -n "+${LOG_START[$svc]}" "$LOGS/$svc.log" | grep -c NOPERM >/dev/null; then # -c reads it all (pipefail)
		printf '\033[1;31merror:\033[0m %s ran a Redis command its ACL user may not (NOPERM in run/dev/logs/%s.log)\n' "$svc" "$svc" >&2
		status=1
	fi
done

# CI: what a newcomer would try next, against this stack (scripts/try-next.sh).
if [ -n "${RUN_ONCE:-}" ] && [ -n "$demo" ] && [ "$status" -eq 0 ]; then
	scripts/try-next.sh "$API" "$RUN" || status=$?
	[ "$status" -eq 0 ] || printf '\033[1;31merror:\033[0m a command make run prints, or an example of the docs, failed (scripts/try-next.sh)\n' >&2
fi

# The web console (docs/console.md): its URL and an admin key to sign in with.
if curl -fsS -o /dev/null "http://$API/ui/signin"; then
	console_key=$(bin/deployer keys create --name "console-$(date +%s)" --scopes admin --json | jq -r .key)
	step "web console: http://$API/ui/ (sign in with this admin key, printed once: only its hash is stored)"
	printf '\n  console key: %s\n\n' "$console_key"
else
	printf '\033[1;31merror:\033[0m the web console does not answer on http://%s/ui/signin\n' "$API" >&2
	status=1
fi

if [ -n "${RUN_ONCE:-}" ]; then
	step "RUN_ONCE set: stopping"
	exit "$status"
fi
step "system running; Ctrl-C stops the services"
wait
