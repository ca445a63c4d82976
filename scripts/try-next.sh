#!/usr/bin/env bash
# try-next.sh: play the newcomer against the stack `make run` leaves
# (RUN_ONCE=1 make run calls it, so CI runs it; it can also be run by hand
# while `make run` runs). It fails when any of these fails:
#
#   1. every command make run printed under "Try next" (RUN_DIR/try-next.txt,
#      one a line, run in order in one shell, from the repository's top),
#      curl failing on an HTTP error (--fail-with-body); the synchronous
#      deployment must end succeeded;
#   2. bin/autoprov status and bin/autoprov validate, with no settings but
#      run/dev/autoprov.env (read by default);
#   3. bin/autoprov follow of the finished demo job: prints its result and
#      exits 0 at once;
#   4. the demo deployment's webhook was received and its signature verified
#      by bin/webhooksink, and verifies again here (HMAC of "t.body");
#   5. an SSE client that reconnects with the id of the real run_finished
#      (what a browser's EventSource does when the stream closes) gets 204;
#   6. every fenced shell block (sh, bash, shell, console, or a bare block
#      starting with curl) of README.md and docs/*.md, run as a script
#      (set -euo pipefail, curl failing on HTTP errors, bin/ in PATH) from the
#      repository's top, unless the line before its fence is an HTML comment
#      <!-- not-run: why -->.
#
#   scripts/try-next.sh API_ADDR RUN_DIR
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"
API=$1 RUN=$2
BASE="http://$API/api/v1"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

failed=0 n=0
# result NAME STATUS OUTPUT_FILE: report one check.
result() {
	local name=$1 code=$2 out=$3
	n=$((n + 1))
	if [ "$code" -eq 0 ]; then
		printf '  \033[32mok\033[0m    %s\n' "$name"
		return 0
	fi
	printf '  \033[31mFAIL\033[0m  %s (exit %s)\n' "$name" "$code"
	failed=$((failed + 1))
	[ ! -s "$out" ] || tail -n 20 "$out" | sed 's/^/        | /'
}

# curl as a pasted command should behave: an HTTP error is a failure.
curl() { command curl --fail-with-body --max-time 600 "$@"; }
export -f curl
export PATH="$ROOT/bin:$PATH"

step "try next: the commands make run printed (run/dev/try-next.txt)"
[ -s "$RUN/try-next.txt" ] || die "$RUN/try-next.txt is missing: the demo did not print its commands"
i=0
while IFS= read -r line || [ -n "$line" ]; do
	[ -n "$line" ] || continue
	i=$((i + 1))
	out="$OUT/cmd-$i"
	cmd=$line
	# A finished job's follow must return at once: bound it.
	[[ "$line" != bin/autoprov\ follow* ]] || cmd="timeout 60 $line"
	eval "$cmd" >"$out" 2>&1 </dev/null
	code=$?
	# The synchronous deployment must have ended succeeded.
	if [ "$code" -eq 0 ] && [[ "$line" == *'?wait='* ]] && ! grep -q '"status": "succeeded"' "$out"; then
		code=1
	fi
	name="${line%%#*}"
	name="${name%"${name##*[![:space:]]}"}"
	[[ "$line" != bin/autoprov\ follow* ]] || name="follow-finished: $name"
	result "${name:0:110}" "$code" "$out"
done <"$RUN/try-next.txt"

step "try next: autoprov and deployer keys with run/dev/autoprov.env only"
(env -u REDIS_URL -u DATABASE_URL bin/autoprov status >"$OUT/status" 2>&1 &&
	grep -q 'provisioner:queue' "$OUT/status" && grep -q 'READY' "$OUT/status")
result "bin/autoprov status (streams, and READY servers from the database)" $? "$OUT/status"
env -u REDIS_URL -u DATABASE_URL bin/autoprov validate >"$OUT/validate" 2>&1
result "bin/autoprov validate (every service's settings and secret references)" $? "$OUT/validate"
env -u REDIS_URL -u DATABASE_URL bin/deployer keys list >"$OUT/keys" 2>&1
result "bin/deployer keys list" $? "$OUT/keys"

step "try next: the demo deployment's job, webhook and event stream"
KEY=$(sed -n 's/^export KEY=//p' "$RUN/try-next.txt")
ID=$(sed -n 's#.*/deployments/\([0-9a-f-]*\)/log.*#\1#p' "$RUN/try-next.txt" | head -n1)
JOB=$(curl -sS -H "Authorization: Bearer $KEY" "$BASE/deployments/$ID" | jq -r .job_id)
start=$SECONDS
timeout 60 env -u REDIS_URL -u DATABASE_URL bin/autoprov follow --timeout 5m "$JOB" >"$OUT/follow" 2>&1
code=$?
[ "$code" -ne 0 ] || [ $((SECONDS - start)) -lt 30 ] || code=1
result "follow-finished: bin/autoprov follow $JOB exits 0 at once" "$code" "$OUT/follow"

(grep -F "\"deployment_id\":\"$ID\"" "$RUN/logs/deliveries.log" | jq -e 'select(.signature == "valid")' >/dev/null) >"$OUT/hook" 2>&1
result "webhook of $ID received, signature verified by bin/webhooksink" $? "$OUT/hook"
/usr/bin/python3 - "$RUN" >"$OUT/hook2" 2>&1 <<'PY'
import hashlib, hmac, sys, time
run = sys.argv[1]
header = open(f"{run}/webhooks/last.sig").read().strip()
body = open(f"{run}/webhooks/last.json", "rb").read()
secret = open(f"{run}/secrets/webhook.secret").read().split()[0]
parts = dict(p.split("=", 1) for p in header.split(","))
want = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
assert hmac.compare_digest(want, parts["v1"]), "signature does not match"
assert abs(time.time() - int(parts["t"])) < 3600, "timestamp far from now"
print("valid")
PY
result "webhook signature verified as docs/webhooks.md describes (HMAC-SHA256 of t.body)" $? "$OUT/hook2"

curl -sSN -H "Authorization: Bearer $KEY" "$BASE/deployments/$ID/events" >"$OUT/sse" 2>&1
last=$(awk '/^id: /{id=$2} /^event: run_finished/{print id}' "$OUT/sse" | tail -n1)
if [ -z "$last" ]; then
	result "sse-after-end: the finished deployment's events end with run_finished" 1 "$OUT/sse"
else
	code=$(command curl -sS -o "$OUT/sse2" -w '%{http_code}' --max-time 30 -H "Authorization: Bearer $KEY" \
		-H "Last-Event-ID: $last" "$BASE/deployments/$ID/events")
	[ "$code" = 204 ]
	result "sse-after-end: reconnect with Last-Event-ID $last (the real run_finished) answers 204 (got $code)" $? "$OUT/sse2"
fi

step "try next: the examples of README.md and docs/*.md"
/usr/bin/python3 - "$OUT/blocks" README.md docs/*.md <<'PY'
# Writes each fenced shell block to OUT/blocks/NNN (first line: "# file:line",
# or "# not-run file:line reason").
import os, re, sys
out = sys.argv[1]
os.makedirs(out)
n = 0
for path in sys.argv[2:]:
    lines = open(path).read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```\s*([A-Za-z]*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = lines[i + 1:j]
        i = j + 1
        first = next((l for l in body if l.strip() and not l.lstrip().startswith("#")), "")
        if lang not in ("sh", "bash", "shell", "console") and not (lang == "" and first.lstrip().startswith("curl ")):
            continue
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = re.match(r"^<!--\s*not-run:\s*(.*?)\s*-->$", lines[k].strip()) if k >= 0 else None
        n += 1
        with open(os.path.join(out, f"{n:03d}"), "w") as f:
            if mark:
                f.write(f"# not-run {path}:{start + 1} {mark.group(1)}\n")
            else:
                f.write(f"# {path}:{start + 1}\n")
            f.write("\n".join(body) + "\n")
PY
for block in "$OUT"/blocks/*; do
	head=$(head -n1 "$block")
	if [[ "$head" == "# not-run "* ]]; then
		printf '  skip  %s (marked not-run)\n' "${head#\# not-run }"
		continue
	fi
	# The examples name make run's default API address.
	sed -i "s#127\.0\.0\.1:8080#$API#g" "$block"
	(cd "$ROOT" && timeout 900 bash -euo pipefail "$block") >"$block.out" 2>&1 </dev/null
	result "example ${head#\# }" $? "$block.out"
done

if [ "$failed" -gt 0 ]; then
	die "try next: $failed of $n checks failed"
fi
step "try next: $n checks passed"
