#!/usr/bin/python3
"""ansible_job.py: run an Ansible job through the deployer's API, for CI.

Standard library only: copy this file into a pipeline. It submits a job
(POST /api/v1/jobs, the JSON body of docs/deployer.md "Ansible jobs"), follows
its progress as server-sent events (GET /api/v1/jobs/{id}/stream, resumed
with Last-Event-ID when the connection drops), then prints the final state
and exits 0 only when the job succeeded (1 otherwise, 2 for a refused
request).

    export AUTOPROV_API_URL=https://deployer.example.com   # default http://127.0.0.1:8080
    export AUTOPROV_API_KEY=apk_...                        # a key with jobs:write for the project
    docs/examples/ansible_job.py job.json --idempotency-key "$CI_PIPELINE_ID-site"

The key is read from the environment only (never a command-line argument,
which other users of the machine can read). Give --idempotency-key with an
id of the pipeline run: a retried step then finds the same job instead of
starting a second one.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def api(method, path, body=None, headers=None, timeout=60):
    base = os.environ.get("AUTOPROV_API_URL", "http://127.0.0.1:8080").rstrip("/")
    req = urllib.request.Request(base + path, method=method, data=body)
    req.add_header("Authorization", "Bearer " + os.environ["AUTOPROV_API_KEY"])
    if body is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    return urllib.request.urlopen(req, timeout=timeout)


def problem(err):
    """The API's problem details (RFC 9457) as one line."""
    try:
        p = json.load(err)
    except ValueError:
        return f"HTTP {err.code}"
    fields = "; ".join(f"{e['field']}: {e['message']}" for e in p.get("errors", []))
    return f"HTTP {err.code}: {p.get('detail', p.get('title', ''))}" + (f" ({fields})" if fields else "")


def show(event):
    kind = event.get("type", "")
    if kind == "play_started":
        print(f"play  {event.get('play', '')}", flush=True)
    elif kind == "task_started":
        print(f"  task  {event.get('task', '')}", flush=True)
    elif kind.startswith("host_"):
        line = f"        {event.get('host', '')}: {kind[5:]}"
        if kind in ("host_failed", "host_unreachable") and event.get("message"):
            line += ": " + event["message"][:200]
        print(line, flush=True)
    elif kind == "run_finished":
        print(f"run finished: {event.get('status', '')}", flush=True)


def follow(job_id, deadline):
    """Print the job's events until run_finished; reconnect after drops."""
    last = None
    while time.monotonic() < deadline:
        headers = {"Accept": "text/event-stream"}
        if last:
            headers["Last-Event-ID"] = last
        try:
            with api("GET", f"/api/v1/jobs/{job_id}/stream", headers=headers, timeout=120) as resp:
                if resp.status == 204:  # the end was seen already
                    return
                ev_id = ev_type = data = None
                for raw in resp:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line.startswith("id: "):
                        ev_id = line[4:]
                    elif line.startswith("event: "):
                        ev_type = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif line == "" and ev_type:
                        show(json.loads(data or "{}"))
                        last = ev_id or last
                        if ev_type == "run_finished":
                            return
                        ev_id = ev_type = data = None
        except urllib.error.HTTPError as err:
            if err.code < 500 and err.code != 429:
                raise
        except OSError:
            pass  # dropped: the deployer restarted, or the network
        time.sleep(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", help="the job as JSON (a file, or - for stdin)")
    ap.add_argument("--idempotency-key", help="the same key and body is the same job (safe retries)")
    ap.add_argument("--timeout", type=float, default=3600, help="give up following after this many seconds")
    args = ap.parse_args()
    body = sys.stdin.buffer.read() if args.job == "-" else open(args.job, "rb").read()
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    try:
        with api("POST", "/api/v1/jobs", body, headers) as resp:
            job = json.load(resp)
    except urllib.error.HTTPError as err:
        print(f"job refused: {problem(err)}", file=sys.stderr)
        return 2
    print(f"job {job['id']} {job['status']}: {job['links']['self']}", flush=True)
    follow(job["id"], time.monotonic() + args.timeout)
    # The stream's end comes a moment before the result is recorded: ?wait=
    # holds the answer until the job's final state.
    with api("GET", f"/api/v1/jobs/{job['id']}?wait=60s", timeout=120) as resp:
        job = json.load(resp)
    p = job["progress"]
    print(f"job {job['id']}: {job['status']} (hosts ok {p['hosts_ok']}, changed {p['hosts_changed']}, "
          f"failed {p['hosts_failed']}, unreachable {p['hosts_unreachable']}); log: {job['log_url']}")
    err = (job.get("result") or {}).get("error")
    if err:
        print(f"error: {err['kind']}: {err.get('message', '')}", file=sys.stderr)
    return 0 if job["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
