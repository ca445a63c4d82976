#!/usr/bin/python3
"""follow-server.py: show a server's way through the system, for `make run`.

Polls the scheduler's view of the server (`scheduler servers show --json`)
and prints each step of its history as it happens (detected, queued,
published, result), follows the progress events of its job live from
job:provision:<job_id>:events, and at the end prints the notification the local
webhook receiver got. Exits 0 when the server became READY.

    DATABASE_URL=... REDIS_URL=... scripts/follow-server.py --server local-target \
        --scheduler bin/scheduler --webhook-log run/dev/logs/webhook.log
"""

import argparse
import json
import os
import subprocess
import sys
import time

import msgpack  # Debian: python3-msgpack
import redis  # Debian: python3-redis


def show_event(event):
    kind = event.get("type", "")
    host = event.get("host", "")
    msg = event.get("message", "")
    if kind == "play_started":
        print(f"      play  {event.get('play', '')}", flush=True)
    elif kind == "task_started":
        print(f"      task  {event.get('task', '')}", flush=True)
    elif kind.startswith("host_"):
        status = kind[len("host_"):]
        line = f"            {host}: {status}"
        if status in ("failed", "unreachable") and msg:
            line += f": {msg[:200]}"
        print(line, flush=True)
    elif kind:
        print(f"      {kind}  {msg}".rstrip(), flush=True)


def server(args):
    out = subprocess.run([args.scheduler, "servers", "show", args.server, "--json"],
                         capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--scheduler", default="bin/scheduler")
    ap.add_argument("--webhook-log", required=True)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0"))
    deadline = time.time() + args.timeout
    seen = set()
    job, events_from = None, "0-0"
    final = None
    print(f"==> waiting for the scheduler to detect {args.server}", flush=True)
    while time.time() < deadline and final is None:
        s = server(args)
        if s:
            for h in sorted(s.get("history") or [], key=lambda h: h["ID"]):
                if h["ID"] in seen:
                    continue
                seen.add(h["ID"])
                step = f"{h['Event']}: {h['From'] or '-'} -> {h['To']} by {h['Actor']}"
                if h.get("Reason"):
                    step += f" ({h['Reason'][:160]})"
                print(f"==> {args.server} {step}", flush=True)
                if h["Event"] == "result":
                    final = h["To"]
            pending = s["server"].get("pending_job_id")
            if pending and pending != job:
                job, events_from = pending, "0-0"
                print(f"==> following job {job} (job:provision:{job}:events)", flush=True)
        if job and final is None:
            got = r.xread({f"job:provision:{job}:events": events_from}, count=100, block=500)
            for _, entries in got or []:
                for entry_id, fields in entries:
                    events_from = entry_id
                    try:
                        show_event(msgpack.unpackb(fields[b"data"], raw=False))
                    except Exception as e:  # a malformed event must not stop the demo
                        print(f"      (unreadable event {entry_id}: {e})", flush=True)
        else:
            time.sleep(0.5)
    if final is None:
        print(f"error: {args.server} did not finish in {args.timeout:.0f}s", file=sys.stderr)
        return 1
    print(f"==> waiting for the notification at the local webhook receiver ({args.webhook_log})", flush=True)
    if final != "READY":
        # FAILED with retries left is not notified (only final states are).
        deadline = min(deadline, time.time() + 15)
    text = ""
    while time.time() < deadline:
        try:
            with open(args.webhook_log, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if args.server in text:
            break
        time.sleep(0.5)
    if args.server in text:
        print("==> webhook receiver log:", flush=True)
        for line in text.strip().splitlines():
            print(f"    {line}", flush=True)
    else:
        print("error: no notification reached the webhook receiver", file=sys.stderr)
        return 1
    return 0 if final == "READY" else 1


if __name__ == "__main__":
    sys.exit(main())
