#!/usr/bin/env bash
# demo-ansible-job.sh: the Ansible job of `make run` (issue 23), called by
# run.sh after the demo deployment. It puts a small playbook in a git
# repository the demo's git server (scripts/gitserve, started by
# demo-deploy.sh) serves, creates a project key with jobs:write, submits
# the playbook as a job on local-target through POST /api/v1/jobs, follows
# it live (SSE), shows the result and the file the play wrote on the target,
# and prints the curl that runs it again.
#
# It runs only when infra serves Ansible jobs (its --help lists JOB_POOLS);
# otherwise it says so and exits 0.
#
# (No callback_url: the local receiver verifies the demo deployment key's
# webhooks, which try-next.sh checks last.)
#
#   scripts/demo-ansible-job.sh API_ADDR RUN_DIR TARGET_ADDR HOST_ADDR GIT_PORT TARGET_ROOT PROJECT
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"
API=$1 RUN=$2 TARGET_ADDR=$3 HOST_ADDR=$4 GIT_PORT=$5 TARGET_ROOT=$6
BASE="http://$API/api/v1"

# (The help is read whole first: grep -q would stop reading at the match,
# and infra, writing the rest into a closed pipe, would fail the pipeline.)
help=$(bin/infra --help 2>&1 || true)
if ! grep -q JOB_POOLS <<<"$help"; then
	step "skipped: the Ansible job demo (this infra has no consumer of ansible:job:queue)"
	exit 0
fi

# The playbook, in a bare repository next to the demo project's (the git
# server serves everything under RUN_DIR/git).
rm -rf "$RUN/git/acme/playbooks.git" "$RUN/git-playbooks"
mkdir -p "$RUN/git-playbooks"
(
	cd "$RUN/git-playbooks"
	export GIT_CONFIG_NOSYSTEM=1 HOME="$RUN/git-playbooks" GIT_AUTHOR_NAME=demo GIT_AUTHOR_EMAIL=demo@example.com \
		GIT_COMMITTER_NAME=demo GIT_COMMITTER_EMAIL=demo@example.com
	git init -q --initial-branch=main .
	cat >hello.yml <<'YAML'
- name: Hello from an Ansible job
  hosts: all
  gather_facts: false
  tasks:
    - name: Write the greeting
      ansible.builtin.copy:
        content: "{{ greeting }}\n"
        dest: /tmp/autoprov-job.txt
        mode: "0644"
YAML
	git add -A && git commit -q -m "hello playbook" && git tag v1
	git clone -q --bare . "$RUN/git/acme/playbooks.git"
)

# The project that owns local-target (run.sh's inventory says so).
PROJECT=${7:?the project that owns the target}
step "an API key with jobs:write for project $PROJECT (printed once)"
KEY=$(bin/deployer keys create --name "jobs-demo-$(date +%s)" --scopes jobs:write --project "$PROJECT" --json | jq -r .key)
printf '\n  API key: %s\n\n' "$KEY"
AUTH=(-H "Authorization: Bearer $KEY")

# local-target is a registered server: infra reaches it as registered (its
# own SSH user, key and pinned host key), found by its address.
body=$(jq -cn --arg repo "http://$HOST_ADDR:$GIT_PORT/acme/playbooks.git" --arg addr "$TARGET_ADDR" '{
	source: {type: "playbook", repository: $repo, ref: "v1", paths: ["hello.yml"]},
	inventory: {type: "inline", hosts: {"local-target": {ansible_host: $addr}}},
	options: {extra_vars: {greeting: "hello from an Ansible job of make run"}, diff: true, timeout: 600}}')
step "POST $BASE/jobs (hello.yml at v1 from the demo's git server, on local-target)"
echo "  $body"
resp=$(curl -sS --fail-with-body "${AUTH[@]}" -H 'Content-Type: application/json' -H "Idempotency-Key: job-demo-$(date +%s%N)" \
	-d "$body" "$BASE/jobs") || die "job refused: $resp"
ID=$(jq -r .id <<<"$resp")
echo "  202 Accepted: job $ID"

step "GET $BASE/jobs/$ID/stream (Server-Sent Events, live)"
curl -sSN --max-time 600 "${AUTH[@]}" "$BASE/jobs/$ID/stream" | /usr/bin/python3 scripts/follow-events.py ||
	die "the job's event stream ended without its terminal event"

final=$(curl -sS "${AUTH[@]}" "$BASE/jobs/$ID?wait=60s")
jq '{id, status, progress, commit: .result.commit, playbooks: .result.playbooks, hosts: .result.hosts, error: .result.error, log_url}' <<<"$final"
status=$(jq -r .status <<<"$final")
[ "$status" = succeeded ] || die "the job ended $status (see run/dev/logs/infra.log and GET $BASE/jobs/$ID/logs)"
step "job $ID succeeded; on the target, /tmp/autoprov-job.txt: $(cat "$TARGET_ROOT/tmp/autoprov-job.txt" 2>/dev/null || echo '(not visible from here)')"

printf '\nRun it again (a new job each time; the same Idempotency-Key would give this one back), then follow it:\n\n'
printf "  curl -sS -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '%s' '%s/jobs?wait=5m' | jq .status\n" "$KEY" "$body" "$BASE"
printf '  AUTOPROV_API_URL=http://%s AUTOPROV_API_KEY=%s bin/autoprov job status %s\n\n' "$API" "$KEY" "$ID"
