#!/bin/sh
# demo.sh: the main job of `make run`, in docker compose. Registers the demo
# target as server "local-target" (a fresh registration: no pinned host key)
# waiting for the demo's job, and runs scripts/demo-job.py: publish a
# ProvisionerMessage, print the progress events live, print the result, exit
# 0 when the job succeeded.
set -eu
host=${DEMO_TARGET_HOST:-target}
addr=$(getent hosts "$host" | awk '{print $1; exit}')
[ -n "$addr" ] || { echo "demo: cannot resolve $host" >&2; exit 1; }
# The server is registered as the scheduler leaves one whose job it handed
# to infra (PROVISIONING, waiting for that job): a NEW server would be
# queued by the scheduler's next tick too, and the target provisioned twice
# (the second run still going when the demo ends).
job="demo-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
psql -q "$DATABASE_URL" -v ON_ERROR_STOP=1 -v addr="$addr" -v job="$job" <<'SQL'
DELETE FROM servers WHERE handle = 'local-target';
INSERT INTO servers (handle, address, ssh_port, labels, status, pending_job_id, pending_action, queued_at)
VALUES ('local-target', :'addr', 22, '{"env":"local"}', 'PROVISIONING', :'job', 'provision', now());
SQL
echo "registered server local-target ($addr:22), waiting for job $job"
exec python3 /usr/local/bin/demo-job.py --server-handle local-target --job-id "$job"
