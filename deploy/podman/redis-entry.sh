#!/bin/sh
# redis-entry.sh: what the official image's entry point does for compose:
# Redis listens on every address of the container (no protected mode: no
# password on a private network) and keeps its files in /data.
set -eu
if [ "${1:-}" = redis-server ]; then
	shift
	exec redis-server --bind '* -::*' --protected-mode no --dir /data "$@"
fi
exec "$@"
