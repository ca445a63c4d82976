#!/bin/sh
# demo.sh: the main job of `make run`, in docker compose. Registers the demo
# target as server "local-target" (a fresh registration: no pinned host key)
# and runs scripts/demo-job.py: publish a ProvisionerMessage, print the
# progress events live, print the result, exit 0 when the job succeeded.
set -eu
host=${DEMO_TARGET_HOST:-target}
addr=$(getent hosts "$host" | awk '{print $1; exit}')
[ -n "$addr" ] || { echo "demo: cannot resolve $host" >&2; exit 1; }
psql -q "$DATABASE_URL" -v ON_ERROR_STOP=1 -v addr="$addr" <<'SQL'
DELETE FROM servers WHERE handle = 'local-target';
INSERT INTO servers (handle, address, ssh_port, labels) VALUES ('local-target', :'addr', 22, '{"env":"local"}');
SQL
echo "registered server local-target ($addr:22)"
exec python3 /usr/local/bin/demo-job.py --server-handle local-target
