#!/usr/bin/env python3
"""Prints a deployment's Server-Sent Events (read from stdin, as
`curl -N .../events` writes them) the way an operator watches a run:
plays, tasks and per-host outcomes as they happen, then the end."""
import json
import sys


def show(kind, data):
    host = data.get("host", "")
    msg = data.get("message", "")
    if kind == "play_started":
        print(f"play  {data.get('play', '')}", flush=True)
    elif kind == "task_started":
        print(f"  task  {data.get('task', '')}", flush=True)
    elif kind.startswith("host_"):
        line = f"        {host}: {kind[5:]}"
        if msg and kind in ("host_failed", "host_unreachable"):
            line += f"  {msg}"
        print(line, flush=True)
    elif kind == "run_finished":
        print(f"run_finished   {data.get('status', '')}  {msg}".rstrip(), flush=True)
    else:
        print(f"{kind}  {msg}".rstrip(), flush=True)


def main():
    kind, data, events = "", "", 0
    for raw in sys.stdin:
        line = raw.rstrip("\r\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and kind:
            events += 1
            try:
                show(kind, json.loads(data))
            except ValueError:
                print(f"{kind}  (unreadable event)", flush=True)
            if kind == "run_finished":
                return 0
            kind, data = "", ""
    return 0 if events else 1


if __name__ == "__main__":
    sys.exit(main())
