#!/bin/sh
# TEST STAND-IN for the docker CLI: no Docker engine can run in the test
# targets (they share the test machine's kernel), so the tests install this
# script as /usr/local/bin/docker inside the target only. It records every
# call in /var/log/docker-standin.log and imitates what the playbooks rely on:
#   docker info                      answers, or hangs while /run/docker-standin/hung exists
#   docker standin-restart           "restarts the daemon" (removes the hung marker)
#   docker {container,image,builder} prune ...   deletes /var/lib/docker-standin/<kind>
#   docker compose ... up            serves the project directory over HTTP on $PORT
#                                    (python3 http.server) unless it holds a
#                                    "standin-fail" file: then nothing listens
#   docker compose ... down          stops that server
#   docker compose version
set -u
LOG=/var/log/docker-standin.log
STATE=/var/lib/docker-standin
RUN=/run/docker-standin
mkdir -p "$STATE" "$RUN"
echo "docker $* PORT=${PORT:-}" >>"$LOG"

prune() {
	dir="$STATE/$1"
	bytes=0
	if [ -d "$dir" ]; then
		bytes=$(du -sb "$dir" | cut -f1)
		rm -rf "$dir"
		bytes=$((bytes - 4096))
		[ "$bytes" -lt 0 ] && bytes=0
	fi
	echo "Total reclaimed space: ${bytes}B"
}

case "${1:-}" in
info)
	while [ -e "$RUN/hung" ]; do sleep 1; done
	echo "Server Version: standin"
	;;
standin-restart)
	rm -f "$RUN/hung"
	echo "restarted"
	;;
version)
	echo "Client: standin"
	;;
container | image | builder)
	[ "${2:-}" = prune ] || { echo "unsupported: $*" >&2; exit 1; }
	case "$1" in
	container) prune containers ;;
	image) prune images ;;
	builder) prune buildcache ;;
	esac
	;;
compose)
	shift
	name=default dir=$(pwd) cmd=""
	while [ $# -gt 0 ]; do
		case "$1" in
		--project-name) name=$2; shift ;;
		--project-directory) dir=$2; shift ;;
		--profile=*) ;;
		version) echo "Docker Compose version v2.20.0-standin"; exit 0 ;;
		up | down) cmd=$1 ;;
		esac
		shift
	done
	pidfile="$RUN/$name.pid"
	running() { [ -f "$pidfile" ] && kill -0 "$(cut -d' ' -f1 "$pidfile")" 2>/dev/null; }
	stop() { if running; then kill "$(cut -d' ' -f1 "$pidfile")"; fi; rm -f "$pidfile"; }
	case "$cmd" in
	up)
		if running && [ "$(cut -d' ' -f2- "$pidfile")" = "$dir" ]; then
			echo " Container $name-web-1  Running" >&2
			exit 0
		fi
		stop
		echo " Container $name-web-1  Recreated" >&2
		if [ -e "$dir/standin-fail" ]; then
			echo " Container $name-web-1  Started" >&2 # and crashes at once
			exit 0
		fi
		setsid python3 -m http.server "${PORT:?}" --bind 127.0.0.1 --directory "$dir" </dev/null >/dev/null 2>&1 &
		echo "$! $dir" >"$pidfile"
		echo " Container $name-web-1  Started" >&2
		;;
	down)
		stop
		echo " Container $name-web-1  Removed" >&2
		;;
	*) echo "unsupported compose call" >&2; exit 1 ;;
	esac
	;;
*)
	echo "unsupported: $*" >&2
	exit 1
	;;
esac
