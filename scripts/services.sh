#!/usr/bin/env bash
# services.sh: install and run the local backing services (Redis, Postgres)
# as plain processes with their data under run/<profile>/ in this repository.
#
#   scripts/services.sh deps              install missing Debian packages (root)
#   scripts/services.sh start <profile>   start Redis and Postgres (idempotent)
#   scripts/services.sh stop  <profile>   stop them
#   scripts/services.sh env   <profile>   print the REDIS_URL / DATABASE_URL exports
#   scripts/services.sh status <profile>
#
# Profiles keep `make run` and `make test` apart: dev uses ports 16379/15432,
# test uses 16380/15433. Nothing is changed outside run/ except installing
# Debian packages; no system service is started or enabled.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

# Packages every part of the system needs at run or test time.
PACKAGES=(redis-server redis-tools postgresql postgresql-client openssh-server openssh-client
	ansible-core ansible ansible-lint python3-ansible-runner git iproute2 debootstrap
	tinyproxy nftables procps curl ca-certificates python3-redis python3-msgpack
	prometheus) # promtool checks the alert rules (deploy/observability)

profile_ports() {
	case "$1" in
	dev) REDIS_PORT=${REDIS_PORT:-16379} PG_PORT=${PG_PORT:-15432} ;;
	test) REDIS_PORT=${REDIS_PORT:-16380} PG_PORT=${PG_PORT:-15433} ;;
	*) die "unknown profile '$1' (dev or test)" ;;
	esac
	RUN="$ROOT/run/$1"
	PG_USER=autoprov
	PG_PASS=autoprov
	PG_DB=autoprov
}

cmd_deps() {
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
	for svc in redis-server postgresql ssh tinyproxy prometheus; do
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

start_redis() {
	local dir="$RUN/redis"
	mkdir -p "$dir"
	if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
		step "redis already running on 127.0.0.1:$REDIS_PORT"
		return 0
	fi
	step "starting redis on 127.0.0.1:$REDIS_PORT (data in ${dir#"$ROOT"/})"
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$dir" \
		--appendonly yes --appendfsync everysec --save "" --databases 256 \
		--daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
	wait_for "redis" 50 redis-cli -p "$REDIS_PORT" ping
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
		redis-cli -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true
		rm -f "$RUN/redis/redis.pid"
		step "redis stopped"
	fi
	if [ -f "$RUN/postgres/data/postmaster.pid" ]; then
		bin=$(pg_bin)
		as_pg "$bin/pg_ctl" -D "$(readlink -f "$RUN/postgres")/data" -m fast -w stop >/dev/null 2>&1 || true
		step "postgres stopped"
	fi
}

print_env() {
	echo "export REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
	echo "export DATABASE_URL=postgres://$PG_USER:$PG_PASS@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"
}

main() {
	local cmd=${1:-}
	case "$cmd" in
	deps) cmd_deps ;;
	start)
		profile_ports "${2:-dev}"
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
	status)
		profile_ports "${2:-dev}"
		redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && echo "redis: up ($REDIS_PORT)" || echo "redis: down"
		"$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && echo "postgres: up ($PG_PORT)" || echo "postgres: down"
		;;
	*)
		sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		[ -z "$cmd" ] || exit 2
		;;
	esac
}

main "$@"
