#!/usr/bin/env python3
"""Example producer: queue a provisioning and a deploy request, and wait for
their results.

It follows docs/wire-contract.md: each request is a msgpack map with
snake_case keys in the "data" field of a Redis stream entry; the producer
assigns the job_id, and finds its result on the results stream by that
job_id.

Needs redis-py and msgpack (Debian: python3-redis python3-msgpack):

    REDIS_URL=redis://localhost:6379/0 /usr/bin/python3 producer.py --wait 60

Environment: REDIS_URL (default redis://localhost:6379/0) and STREAM_PREFIX
(prepended to every stream name, for tests; default empty). The Redis URL
is read from the environment, not the command line, so that a password in
it never shows in the process list. With SIGNING_KEY_ID and SIGNING_KEY_FILE
(a file holding the producer's key, at least 32 bytes, e.g. the output of
`openssl rand -hex 32`) every request is signed (docs/wire-contract.md,
"Signed requests").

Prints one JSON line per request sent and per result received. Exits 0 when
every awaited result arrived, 2 on timeout.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone

import msgpack
import redis

PROVISIONER_QUEUE = "provisioner:queue"
ANSIBLE_DEPLOY_QUEUE = "ansible:deploy:queue"
PROVISIONER_RESULTS = "provisioner:results"
DEPLOY_RESULTS = "deploy:results"
DATA_FIELD = b"data"
SIG_FIELD = b"sig"
SCHEMA_VERSION = 1


def now():
    """The current time as the contract writes it: RFC 3339, UTC, ms."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def last_id(r, stream):
    """The id of the newest entry of stream, "0-0" when it is empty.

    Taken before sending, so that a result published at once is not missed.
    """
    newest = r.xrevrange(stream, count=1)
    return newest[0][0] if newest else b"0-0"


def signature(stream, data):
    """The sig field for data appended to stream, or None without a key.

    HMAC-SHA256 under the producer's key of b"autoprov-sig-v1\\0", the
    stream name, b"\\0" and the data, as "v1:<key id>:<base64url, no padding>".
    """
    key_id, key_file = os.environ.get("SIGNING_KEY_ID"), os.environ.get("SIGNING_KEY_FILE")
    if not key_id or not key_file:
        return None
    with open(key_file, "rb") as f:
        key = f.read().strip()
    mac = hmac.new(key, b"autoprov-sig-v1\0" + stream.encode() + b"\0" + data, hashlib.sha256).digest()
    return "v1:%s:%s" % (key_id, base64.urlsafe_b64encode(mac).rstrip(b"=").decode())


def send(r, stream, message):
    """XADD message (signed, with a key) to stream; return the entry id."""
    # Leave out None values: the contract treats them as absent anyway.
    message = {k: v for k, v in message.items() if v is not None}
    data = msgpack.packb(message, use_bin_type=True)
    fields = {DATA_FIELD: data}
    sig = signature(stream, data)
    if sig:
        fields[SIG_FIELD] = sig
    return r.xadd(stream, fields).decode()


def wait_results(r, pending, positions, timeout):
    """Read the results streams until every job in pending has its result.

    pending maps job_id -> results stream; positions maps stream -> the id
    to read after. Yields (stream, result) for each awaited result.
    """
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        # Block at most 1 s per call, then check the deadline again.
        reply = r.xread(positions, count=100, block=int(min(left, 1.0) * 1000) or 1)
        for stream, entries in reply or []:
            stream = stream.decode()
            for entry_id, fields in entries:
                positions[stream] = entry_id
                if DATA_FIELD not in fields:
                    continue
                result = msgpack.unpackb(fields[DATA_FIELD], raw=False)
                job_id = result.get("job_id")
                if pending.get(job_id) == stream:
                    del pending[job_id]
                    yield stream, result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wait", type=float, default=0, help="seconds to wait for the results (0: do not wait)")
    p.add_argument("--server-handle", default="web-1")
    p.add_argument("--force-reinstall", action="store_true")
    p.add_argument("--project-id", default="9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f")
    p.add_argument("--repo", default="acme/shop")
    p.add_argument("--branch", default="main")
    p.add_argument("--server-ip", default="192.0.2.10")
    p.add_argument("--port", type=int, default=8080, help="the application's port, handed to the deploy playbook")
    p.add_argument("--ssh-port", type=int, default=0,
                   help="SSH port of a target that is not a registered server (0: leave it out, 22)")
    p.add_argument("--modules", default="nginx,app", help="comma-separated module names")
    p.add_argument("--github-token-ref", default="env:GITHUB_TOKEN")
    p.add_argument("--secrets-ref", default="vault:secret/data/shop/prod")
    args = p.parse_args()

    prefix = os.environ.get("STREAM_PREFIX", "")
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))

    results_streams = [prefix + PROVISIONER_RESULTS, prefix + DEPLOY_RESULTS]
    positions = {s: last_id(r, s) for s in results_streams}

    deploy_extra = {"ssh_port": args.ssh_port} if args.ssh_port else {}
    requests = [
        (
            prefix + PROVISIONER_QUEUE,
            prefix + PROVISIONER_RESULTS,
            {
                "schema_version": SCHEMA_VERSION,
                "job_id": str(uuid.uuid4()),
                "correlation_id": "example-producer",
                "created_at": now(),
                "server_handle": args.server_handle,
                "force_reinstall": args.force_reinstall,
            },
        ),
        (
            prefix + ANSIBLE_DEPLOY_QUEUE,
            prefix + DEPLOY_RESULTS,
            {
                "schema_version": SCHEMA_VERSION,
                "job_id": str(uuid.uuid4()),
                "correlation_id": "example-producer",
                "created_at": now(),
                "project_id": args.project_id,
                "repo_full_name": args.repo,
                "branch": args.branch,
                "server_ip": args.server_ip,
                # The application's port; the SSH port is the registered
                # server's, or ssh_port for an unregistered target.
                "port": args.port,
                "modules": [m for m in args.modules.split(",") if m],
                # References to secrets, never the secrets themselves.
                "github_token_ref": args.github_token_ref,
                "secrets_ref": args.secrets_ref,
                **deploy_extra,
            },
        ),
    ]

    pending = {}
    for stream, results_stream, message in requests:
        entry_id = send(r, stream, message)
        pending[message["job_id"]] = results_stream
        print(json.dumps({"event": "sent", "stream": stream, "entry_id": entry_id, "message": message}), flush=True)

    if args.wait <= 0:
        return 0
    for stream, result in wait_results(r, pending, positions, args.wait):
        print(json.dumps({"event": "result", "stream": stream, "result": result}), flush=True)
    if pending:
        print(json.dumps({"event": "timeout", "job_ids": sorted(pending)}), flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
