#!/usr/bin/env bash
# demo-deploy.sh: the deployer's part of `make run` (called by run.sh once
# local-target is provisioned). It serves a demo project from a local git
# repository, creates an API key (printed once), submits a deployment
# through the HTTP API with curl, follows its events live, shows the result
# and the log, waits for the deployment's webhook at the local receiver
# (bin/webhooksink, started by run.sh, verifying its signature), and prints
# the commands a user would try next; they are also written to
# RUN_DIR/try-next.txt, one a line, for scripts/try-next.sh to run.
#
# The git server stays up after this script (the printed commands deploy
# again): run.sh stops it with the services (its pid in RUN_DIR/gitserve.pid).
#
#   WEBHOOK_URL=http://127.0.0.1:9197/hooks/deploy \
#   scripts/demo-deploy.sh API_ADDR RUN_DIR TARGET_ADDR HOST_ADDR GIT_PORT TARGET_ROOT PROJECT
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"
API=$1 RUN=$2 TARGET_ADDR=$3 HOST_ADDR=$4 GIT_PORT=$5 TARGET_ROOT=$6
# The project that owns local-target (run.sh's inventory says so): infra
# deploys a project only to servers it owns or that belong to no project.
PROJECT=${7:?the project that owns the target}
BASE="http://$API/api/v1"

# The demo project: a compose file and a page, in a bare repository served
# with git's smart HTTP protocol (scripts/gitserve: git http-backend behind
# Go's CGI handler) on the target's side of its veth; a public repository,
# so no token is needed.
GIT="$RUN/git"
rm -rf "$GIT" "$RUN/git-work"
mkdir -p "$GIT/acme" "$RUN/git-work"
(
	cd "$RUN/git-work"
	export GIT_CONFIG_NOSYSTEM=1 HOME="$RUN/git-work" GIT_AUTHOR_NAME=demo GIT_AUTHOR_EMAIL=demo@example.com \
		GIT_COMMITTER_NAME=demo GIT_COMMITTER_EMAIL=demo@example.com
	git init -q --initial-branch=main .
	printf 'services:\n  web:\n    image: nginx\n    ports: ["${PORT}:80"]\n    profiles: [web]\n' >compose.yml
	printf '<h1>demo deployed by autoprovisioner</h1>\n' >index.html
	git add -A && git commit -q -m "demo project"
	git clone -q --bare . "$GIT/acme/demo.git"
)
GOWORK=off go build -o bin/gitserve scripts/gitserve/main.go
bin/gitserve --listen "$HOST_ADDR:$GIT_PORT" --root "$GIT" >"$RUN/logs/gitserve.log" 2>&1 &
echo $! >"$RUN/gitserve.pid"
# No Docker engine can run in the local target (it shares this machine's
# kernel): the docker CLI there is the recording stand-in the Ansible tests
# use, which serves the project over HTTP on its port.
install -m 0755 ansible/tests/testdata/docker-standin.sh "$TARGET_ROOT/usr/local/bin/docker"

step "an API key for the demo (printed once: only its hash is stored)"
# An operator's key: it reads the fleet too, so it is fleet-wide (a CI key
# would be bound to its project with --project instead).
created=$(bin/deployer keys create --name "demo-$(date +%s)" --scopes deployments:write,servers:read --fleet-wide --json)
KEY=$(jq -r .key <<<"$created")
printf '\n  API key: %s\n\n' "$KEY"
# Its webhook secret (shown once too) goes to the receiver, which verifies
# each delivery's signature with it.
SECRET_FILE="$RUN/secrets/webhook.secret"
(umask 077 && jq -r .webhook_secret <<<"$created" >"$SECRET_FILE")
grep -q '^whsec_' "$SECRET_FILE" || die "deployer keys create gave no webhook secret (is WEBHOOK_SIGNING_KEY_FILE in run/dev/autoprov.env?)"
AUTH=(-H "Authorization: Bearer $KEY")

step "POST $BASE/deployments (deploy acme/demo to local-target, $TARGET_ADDR)"
# port is the application's port (the demo stack publishes on it); SSH goes to
# local-target's registered ssh_port, which the request does not carry.
body=$(printf '{"project_id":"%s","repo_full_name":"acme/demo","branch":"main","server_ip":"%s","port":8080,"modules":["web"],"options":{"timeout_seconds":900,"callback_url":"%s"}}' \
	"$PROJECT" "$TARGET_ADDR" "$WEBHOOK_URL")
echo "  $body"
resp=$(curl -sS --fail-with-body "${AUTH[@]}" -H 'Content-Type: application/json' -H "Idempotency-Key: demo-$(date +%s%N)" \
	-d "$body" "$BASE/deployments") || die "submit failed: $resp"
ID=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$resp")
echo "  202 Accepted: deployment $ID"

step "GET $BASE/deployments/$ID/events (Server-Sent Events, live)"
curl -sSN --max-time 900 "${AUTH[@]}" "$BASE/deployments/$ID/events" | /usr/bin/python3 scripts/follow-events.py ||
	die "the event stream ended without its terminal event"

step "GET $BASE/deployments/$ID"
final=$(curl -sS "${AUTH[@]}" "$BASE/deployments/$ID?wait=60s")
/usr/bin/python3 - "$final" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
r = d.get("result") or {}
print(json.dumps({"id": d["id"], "status": d["status"], "started_at": d.get("started_at"),
                  "finished_at": d.get("finished_at"), "hosts": r.get("hosts"), "error": r.get("error"),
                  "links": d["links"]}, indent=2))
PY
status=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' <<<"$final")

step "GET $BASE/deployments/$ID/log (the whole output; last lines)"
curl -sS "${AUTH[@]}" "$BASE/deployments/$ID/log" | tail -n 8 | sed 's/^/  /'

[ "$status" = succeeded ] || die "the deployment ended $status"
step "deployment $ID succeeded"

step "its webhook at the local receiver (run/dev/logs/deliveries.log; signature checked with the key's secret)"
for i in $(seq 1 300); do
	line=$(grep -F "\"deployment_id\":\"$ID\"" "$RUN/logs/deliveries.log" 2>/dev/null | tail -n1 || true)
	[ -z "$line" ] || break
	sleep 0.1
done
[ -n "$line" ] || die "no webhook for deployment $ID within 30 s (see run/dev/logs/deployer.log and GET $BASE/deployments/$ID/webhooks)"
echo "  $line"
jq -e '.signature == "valid"' <<<"$line" >/dev/null || die "the webhook's signature did not verify"

# The commands to try next: printed, and kept one a line for
# scripts/try-next.sh, which runs each (RUN_ONCE, CI) against this stack.
# Run them from the repository's top: bin/autoprov and bin/deployer read
# run/dev/autoprov.env from there.
JOB=$(jq -r .job_id <<<"$final")
cat >"$RUN/try-next.txt" <<EOF2
export KEY=$KEY
curl -s -H "Authorization: Bearer \$KEY" $BASE/deployments | jq .
curl -s -H "Authorization: Bearer \$KEY" $BASE/deployments/$ID | jq .
curl -sN -H "Authorization: Bearer \$KEY" $BASE/deployments/$ID/events           # ends with run_finished
curl -s -H "Authorization: Bearer \$KEY" $BASE/deployments/$ID/log
curl -s -H "Authorization: Bearer \$KEY" $BASE/deployments/$ID/webhooks | jq .  # every attempt
curl -s -H "Authorization: Bearer \$KEY" $BASE/servers | jq .
curl -s -H "Authorization: Bearer \$KEY" -H 'Content-Type: application/json' -d '$body' "$BASE/deployments?wait=5m" | jq .   # again, synchronously
ID2=\$(curl -s -H "Authorization: Bearer \$KEY" -H 'Content-Type: application/json' -d '$body' $BASE/deployments | jq -r .id)   # one more, to cancel
curl -s -X DELETE -H "Authorization: Bearer \$KEY" $BASE/deployments/\$ID2 | jq .   # cancel it
bin/deployer keys list                      # settings from run/dev/autoprov.env
bin/autoprov status                         # streams, consumers, servers (run/dev/autoprov.env)
bin/autoprov validate                       # every service's settings and secrets, as run/dev/autoprov.env holds them
bin/autoprov follow $JOB                    # the demo deployment's job: its events, then its result
tail -n 3 run/dev/logs/deliveries.log       # webhooks received and verified by bin/webhooksink
sig=\$(cat run/dev/webhooks/last.sig); t=\${sig#t=}; t=\${t%%,*}   # the last delivery's Autoprov-Signature: t=...,v1=...
test "\$({ printf '%s.' "\$t"; cat run/dev/webhooks/last.json; } | openssl dgst -sha256 -hmac "\$(cat run/dev/secrets/webhook.secret)" -r | cut -d' ' -f1)" = "\${sig##*v1=}" && echo signature valid   # docs/webhooks.md
curl -s $BASE/openapi.json | jq . | less    # the whole API
EOF2
printf '\nTry next, from %s (the key above has deployments:write and servers:read):\n\n' "$ROOT"
sed 's/^/  /' "$RUN/try-next.txt"
echo
