#!/usr/bin/python3
"""demo-job.py: the main job of `make run`, from the outside.

Publishes a ProvisionerMessage on provisioner:queue (msgpack, as any producer
would; see docs/wire-contract.md), prints the job's progress events live from
job:provision:<job_id>:events, then prints its result from provisioner:results.
Exits 0 when the job succeeded.

    REDIS_URL=redis://127.0.0.1:16379/0 scripts/demo-job.py --server-handle local-target

With SIGNING_KEY_ID and SIGNING_KEY_FILE the request is signed (the wire
contract's "sig" field, as docs/examples/producer.py does).
"""

import argparse
import base64
import datetime
import hashlib
import hmac
import json
import os
import sys
import time
import uuid

import msgpack  # Debian: python3-msgpack
import redis  # Debian: python3-redis

RESULTS = "provisioner:results"


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def show(event):
    kind = event.get("type", "")
    where = " ".join(x for x in (event.get("play", ""), "/", event.get("task", "")) if x).strip(" /")
    host = event.get("host", "")
    msg = event.get("message", "")
    if kind == "task_started":
        print(f"  task  {event.get('task', '')}", flush=True)
    elif kind.startswith("host_"):
        status = kind[len("host_"):]
        line = f"        {host}: {status}"
        if status in ("failed", "unreachable") and msg:
            line += f": {msg[:200]}"
        print(line, flush=True)
    elif kind == "play_started":
        print(f"play  {event.get('play', '')}", flush=True)
    else:
        print(f"{kind}  {where} {msg}".rstrip(), flush=True)


def signature(stream, data):
    """The sig field for data appended to stream, or None without a key."""
    key_id, key_file = os.environ.get("SIGNING_KEY_ID"), os.environ.get("SIGNING_KEY_FILE")
    if not key_id or not key_file:
        return None
    with open(key_file, "rb") as f:
        key = f.read().strip()
    mac = hmac.new(key, b"autoprov-sig-v1\0" + stream.encode() + b"\0" + data, hashlib.sha256).digest()
    return "v1:%s:%s" % (key_id, base64.urlsafe_b64encode(mac).rstrip(b"=").decode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-handle", required=True)
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for the result")
    ap.add_argument("--job-id", help="the job's id (default: demo- and 12 random hex digits)")
    args = ap.parse_args()

    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0"))
    job_id = args.job_id or "demo-" + uuid.uuid4().hex[:12]
    # Remember where the results stream ends, so a fast result is not missed.
    last = r.xrevrange(RESULTS, count=1)
    results_from = last[0][0] if last else b"0-0"

    request = {"schema_version": 1, "job_id": job_id, "server_handle": args.server_handle, "created_at": now_rfc3339()}
    data = msgpack.packb(request)
    fields = {"data": data}
    sig = signature("provisioner:queue", data)
    if sig:
        fields["sig"] = sig
    entry = r.xadd("provisioner:queue", fields)
    signed = f" signed by {os.environ['SIGNING_KEY_ID']}" if sig else ""
    print(f"published ProvisionerMessage {json.dumps(request)} as entry {entry.decode()}{signed}", flush=True)

    events_stream = f"job:provision:{job_id}:events"
    events_from = b"0-0"
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        got = r.xread({events_stream: events_from, RESULTS: results_from}, block=1000, count=100)
        for stream, entries in got or []:
            for entry_id, fields in entries:
                data = msgpack.unpackb(fields[b"data"], raw=False)
                if stream == events_stream.encode():
                    events_from = entry_id
                    show(data)
                    continue
                results_from = entry_id
                if data.get("job_id") != job_id:
                    continue
                print("\nresult:")
                print(json.dumps({k: v for k, v in data.items() if k != "output_tail"}, indent=2, sort_keys=True))
                return 0 if data.get("status") == "succeeded" else 1
    print(f"no result for {job_id} within {args.timeout:.0f}s", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
