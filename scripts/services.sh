#!/usr/bin/env bash
# services.sh: install and run the local backing services (Redis, Postgres)
# as plain processes with their data under run/<profile>/ in this repository.
#
#   scripts/services.sh deps              install missing Debian packages (root)
#   scripts/services.sh start <profile>   start Redis and Postgres (idempotent)
#   scripts/services.sh stop  <profile>   stop them
#   scripts/services.sh env   <profile>   print the REDIS_URL / DATABASE_URL exports
#   scripts/services.sh redis-url <profile> <user>   print the Redis URL of an ACL user
#   scripts/services.sh status <profile>
#
# Profiles keep `make run` and `make test` apart: dev uses ports 16379/15432,
# test uses 16380/15433. Nothing is changed outside run/ except installing
# Debian packages; no system service is started or enabled.
#
# The dev profile runs Redis with the ACL users of deploy/redis/users.acl
# (one per role; the default user is off): their passwords are made once in
# run/dev/secrets/redis/ (0600), the ACL file is rendered with their hashes.
# REDIS_URL (env dev) is the admin user's; each service gets its own user's
# URL (redis-url). The test profile keeps Redis open to its default user.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

# Packages every part of the system needs at run or test time.
PACKAGES=(redis-server redis-sentinel redis-tools postgresql postgresql-client openssh-server openssh-client
	ansible-core ansible ansible-lint python3-ansible-runner git iproute2 debootstrap
	tinyproxy nftables procps curl ca-certificates jq openssl python3-redis python3-msgpack
	prometheus chromium bubblewrap) # promtool checks the alert rules (deploy/observability); redis-sentinel: failover tests;
# chromium: the deployer's web console is tested in it, headless (chromedp)
# bubblewrap: every play runs in a sandbox of its own (docs/security.md)

profile_ports() {
	case "$1" in
	dev) REDIS_PORT=${REDIS_PORT:-16379} PG_PORT=${PG_PORT:-15432} ;;
	test) REDIS_PORT=${REDIS_PORT:-16380} PG_PORT=${PG_PORT:-15433} ;;
	*) die "unknown profile '$1' (dev or test)" ;;
	esac
	RUN="$ROOT/run/$1"
	REDIS_ACL=""
	[ "$1" = dev ] && REDIS_ACL=1
	REDIS_PASSWORDS="$RUN/secrets/redis"
	PG_USER=autoprov
	PG_PASS=autoprov
	PG_DB=autoprov
}

# PLAY_USER runs the playbooks of `make run` and of the tests (PLAYBOOK_USER):
# an unprivileged system user that cannot read the infra process's files.
PLAY_USER=autoprov-play

ensure_play_user() {
	[ "$(id -u)" -eq 0 ] || return 0
	id -u "$PLAY_USER" >/dev/null 2>&1 && return 0
	step "creating the unprivileged system user $PLAY_USER (runs the playbooks)"
	useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PLAY_USER"
}

cmd_deps() {
	ensure_play_user
	local missing=()
	for p in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		step "system packages present"
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		die "missing Debian packages: ${missing[*]}; install them as root: apt-get install -y ${missing[*]}"
	fi
	step "installing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# Debian starts packaged daemons on install; we run our own instances.
	for svc in redis-server redis-sentinel postgresql ssh tinyproxy prometheus; do
		if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
			systemctl stop "$svc" >/dev/null 2>&1 || true
		fi
	done
}

pg_bin() {
	local v
	v=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1)
	[ -n "$v" ] || die "postgresql is not installed (scripts/services.sh deps)"
	echo "/usr/lib/postgresql/$v/bin"
}

# as_pg runs a command as the unprivileged postgres user when we are root
# (postgres refuses to run as root), and as ourselves otherwise.
as_pg() {
	if [ "$(id -u)" -eq 0 ]; then
		(cd / && runuser -u postgres -- "$@") # postgres may not be able to enter our directory
	else
		"$@"
	fi
}

# redis_users are the ACL users the dev profile turns on.
REDIS_USERS=(admin scheduler deployer infra)

# rcli runs redis-cli against the profile's Redis, as its admin user when
# the profile has ACL users.
rcli() {
	if [ -n "$REDIS_ACL" ] && [ -s "$REDIS_PASSWORDS/admin.pass" ]; then
		REDISCLI_AUTH=$(cat "$REDIS_PASSWORDS/admin.pass") redis-cli --user admin -p "$REDIS_PORT" "$@"
	else
		redis-cli -p "$REDIS_PORT" "$@"
	fi
}

# stop_orphan_redis stops the redis on REDIS_PORT when its working
# directory was removed: the instance of a checkout deleted while it ran
# (its passwords went with it). It leaves any other alone and fails.
stop_orphan_redis() {
	local pid i
	pid=$(ss -ltnpH "sport = :$REDIS_PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
	[ -n "$pid" ] || return 1
	[[ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" == *" (deleted)" ]] || return 1
	step "redis on 127.0.0.1:$REDIS_PORT belongs to a removed checkout ($(readlink "/proc/$pid/cwd")): stopping it"
	kill "$pid" 2>/dev/null || return 1
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	return 1
}

start_redis() {
	local dir="$RUN/redis" args=()
	mkdir -p "$dir"
	if [ -n "$REDIS_ACL" ]; then
		"$ROOT/scripts/redis-acl.sh" passwords "$REDIS_PASSWORDS" "${REDIS_USERS[@]}"
		(umask 077 && "$ROOT/scripts/redis-acl.sh" render "$ROOT/deploy/redis/users.acl" "$REDIS_PASSWORDS" >"$dir/users.acl")
		args=(--aclfile "$dir/users.acl")
		if redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
			# Open to anyone: an instance started before ACL users existed.
			step "redis on 127.0.0.1:$REDIS_PORT runs without ACL users: restarting it with them"
			redis-cli -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true
			wait_gone redis-cli -p "$REDIS_PORT" ping
		elif rcli ping 2>/dev/null | grep -q PONG; then
			rcli acl load >/dev/null || die "redis did not load $dir/users.acl"
			step "redis already running on 127.0.0.1:$REDIS_PORT (ACL users reloaded)"
			return 0
		elif redis-cli -p "$REDIS_PORT" ping 2>&1 | grep -q NOAUTH; then
			stop_orphan_redis ||
				die "redis on 127.0.0.1:$REDIS_PORT wants a password that ${REDIS_PASSWORDS#"$ROOT"/} no longer holds: stop it (kill \$(cat ${dir#"$ROOT"/}/redis.pid)) and start again"
		fi
	elif redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
		step "redis already running on 127.0.0.1:$REDIS_PORT"
		return 0
	fi
	step "starting redis on 127.0.0.1:$REDIS_PORT (data in ${dir#"$ROOT"/})"
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$dir" \
		--appendonly yes --appendfsync everysec --save "" --databases 256 \
		--daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "${args[@]}" >/dev/null
	wait_for "redis" 50 rcli ping
}

# wait_gone CMD...: wait (up to 10 s) until CMD fails.
wait_gone() {
	local i
	for ((i = 0; i < 100; i++)); do
		"$@" >/dev/null 2>&1 || return 0
		sleep 0.1
	done
	die "still running: $*"
}

# pg_dir prints the profile's Postgres directory: run/<profile>/postgres, or,
# when we are root and the user postgres cannot reach the repository (a
# checkout under /root, say), a directory under /var/tmp that
# run/<profile>/postgres links to.
pg_dir() {
	local dir="$RUN/postgres"
	if [ "$(id -u)" -ne 0 ] || [ -L "$dir" ]; then
		echo "$dir"
		return
	fi
	mkdir -p "$RUN"
	if runuser -u postgres -- test -x "$RUN"; then
		echo "$dir"
		return
	fi
	local alt
	alt="/var/tmp/autoprovisioner-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)/$(basename "$RUN")/postgres"
	mkdir -p "$alt"
	chmod 0755 "$(dirname "$(dirname "$alt")")" "$(dirname "$alt")"
	ln -sfn "$alt" "$dir"
	step "user postgres cannot reach ${RUN#"$ROOT"/}: its data lives in $alt (linked from ${dir#"$ROOT"/})" >&2
	echo "$dir"
}

start_postgres() {
	local dir bin
	dir=$(pg_dir)
	mkdir -p "$dir/"
	dir=$(readlink -f "$dir") # postgres must not go through an unreachable path
	bin=$(pg_bin)
	if [ "$(id -u)" -eq 0 ]; then
		chown postgres:postgres "$dir"
		chmod 0700 "$dir"
	fi
	if "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; then
		step "postgres already running on 127.0.0.1:$PG_PORT"
		return 0
	fi
	if [ ! -f "$dir/data/PG_VERSION" ]; then
		step "initialising postgres cluster in ${dir#"$ROOT"/}/data"
		local pw="$dir/.pwfile"
		umask 077
		echo "$PG_PASS" >"$pw"
		[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$pw"
		as_pg "$bin/initdb" -D "$dir/data" -U "$PG_USER" --pwfile="$pw" \
			--auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
			{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
		rm -f "$pw"
	fi
	step "starting postgres on 127.0.0.1:$PG_PORT"
	as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start \
		-o "-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories='' -c max_connections=300 -c fsync=on" >/dev/null
	wait_for "postgres" 100 "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"
	if ! PGPASSWORD=$PG_PASS psql -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -tAc \
		"SELECT 1 FROM pg_database WHERE datname='$PG_DB'" | grep -q 1; then
		PGPASSWORD=$PG_PASS psql -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -qc "CREATE DATABASE $PG_DB" >/dev/null
	fi
}

stop_all() {
	local bin
	if [ -f "$RUN/redis/redis.pid" ]; then
		rcli shutdown >/dev/null 2>&1 || true
		wait_gone rcli ping
		rm -f "$RUN/redis/redis.pid"
		step "redis stopped"
	fi
	if [ -f "$RUN/postgres/data/postmaster.pid" ]; then
		bin=$(pg_bin)
		as_pg "$bin/pg_ctl" -D "$(readlink -f "$RUN/postgres")/data" -m fast -w stop >/dev/null 2>&1 || true
		step "postgres stopped"
	fi
	stop_foreign redis-server "$REDIS_PORT" TERM
	stop_foreign postgres "$PG_PORT" INT
}

# stop_foreign NAME PORT SIGNAL: stop the NAME process listening on the
# profile's PORT that another checkout (an earlier CI clone, a removed
# work tree) started, so that `make stop` leaves the machine as fresh as a
# new one. SIGTERM is Redis's clean shutdown, SIGINT Postgres's fast one.
# Processes of other names on the port are left alone.
stop_foreign() {
	local name=$1 port=$2 sig=$3 pid
	pid=$(ss -ltnpH "sport = :$port" 2>/dev/null | grep -o "\"$name\",pid=[0-9]*" | head -1 | cut -d= -f2) || true
	[ -n "$pid" ] || return 0
	step "$name on 127.0.0.1:$port was started elsewhere ($(readlink "/proc/$pid/cwd" 2>/dev/null || echo "pid $pid")): stopping it"
	kill -"$sig" "$pid" 2>/dev/null || return 0
	local i
	for ((i = 0; i < 300; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	die "$name (pid $pid) on port $port did not stop within 30 s"
}

print_env() {
	if [ -n "$REDIS_ACL" ]; then
		echo "export REDIS_URL=$("$ROOT/scripts/redis-acl.sh" url "$REDIS_PASSWORDS" admin "127.0.0.1:$REDIS_PORT/0")"
	else
		echo "export REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
	fi
	echo "export DATABASE_URL=postgres://$PG_USER:$PG_PASS@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"
}

main() {
	local cmd=${1:-}
	case "$cmd" in
	deps) cmd_deps ;;
	start)
		profile_ports "${2:-dev}"
		ensure_dev_null
		cmd_deps
		start_redis
		start_postgres
		;;
	stop)
		profile_ports "${2:-dev}"
		stop_all
		;;
	env)
		profile_ports "${2:-dev}"
		print_env
		;;
	redis-url)
		profile_ports "${2:-dev}"
		[ -n "${3:-}" ] || die "usage: services.sh redis-url <profile> <user>"
		if [ -n "$REDIS_ACL" ]; then
			"$ROOT/scripts/redis-acl.sh" url "$REDIS_PASSWORDS" "$3" "127.0.0.1:$REDIS_PORT/0"
		else
			echo "redis://127.0.0.1:$REDIS_PORT/0"
		fi
		;;
	status)
		profile_ports "${2:-dev}"
		rcli ping >/dev/null 2>&1 && echo "redis: up ($REDIS_PORT)" || echo "redis: down"
		"$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && echo "postgres: up ($PG_PORT)" || echo "postgres: down"
		;;
	*)
		sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		[ -z "$cmd" ] || exit 2
		;;
	esac
}

main "$@"
