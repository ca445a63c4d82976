# -*- coding: utf-8 -*-
# autoprov_events: structured run events for the autoprovisioner infra service.
#
# Writes one JSON object per line to the file (or FIFO) named by the
# environment variable AUTOPROV_EVENTS_PATH; does nothing when it is unset.
# The format is documented in docs/events.md of the repository.
#
# With AUTOPROV_GATE_PATH set (a FIFO the runner holds open), the first play
# waits before its first task until the runner writes "go" there: the
# runner's takeover of the target (pkg/ansible/remote.go) runs while
# ansible-playbook starts up, and no task reaches the target before it is
# done. Anything else (the runner closed the gate) ends ansible-playbook at
# once, before any task.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: autoprov_events
type: notification
short_description: Structured JSON-lines run events for the autoprovisioner
description:
  - Appends one JSON object per line (UTF-8) to the path in C(AUTOPROV_EVENTS_PATH),
    flushed after every line. The path may be a regular file or a FIFO.
  - Does nothing when C(AUTOPROV_EVENTS_PATH) is unset or empty.
  - Uses only the result copies Ansible hands callbacks, which are already
    censored for C(no_log) tasks, and only their C(msg), C(stderr), C(stdout)
    and C(rc) fields.
  - Never raises; an error disables the plugin for the rest of the run.
  - With C(AUTOPROV_GATE_PATH) set, waits before the first play's first task
    until the runner writes C(go) to that FIFO, and exits at once otherwise.
requirements:
  - enabled through callbacks_enabled in ansible.cfg
"""

import errno
import json
import os
import re
import stat
import time
from datetime import datetime, timezone

from ansible.plugins.callback import CallbackBase

# Exit status of ansible-playbook when the runner closed the gate.
GATE_CLOSED_EXIT = 250

VERSION = 1
MAX_LINE = 64 * 1024
# The plugin knows no secrets, so it must not cut a message to the short
# length readers show: a secret straddling the cut would leave a piece no
# redactor recognises. It keeps up to MAX_MSG and says which end it cut
# (msg_cut_start, msg_cut_end); the reader redacts the whole text, masks a
# piece of a secret at a cut end, and only then shortens it further.
MAX_MSG = 32 * 1024
FIFO_OPEN_TIMEOUT = 10.0
CENSORED_KEY = "censored"


def _now():
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (now.microsecond // 1000)


def _text(value):
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "\n".join(_text(v) for v in value)
    return str(value)


def _tail(text, limit):
    """Return at most limit UTF-8 bytes of the end of text."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[-limit:].decode("utf-8", "ignore")


def _head(text, limit):
    """Return at most limit UTF-8 bytes of the start of text."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def _short_msg(result):
    """The text of a (censored) result: msg, else the stderr/stdout tail.

    A msg with a stderr beside it ("non-zero return code" of a command)
    is followed by the stderr, on its own lines, when both fit whole
    within MAX_MSG: the reason a task failed is mostly there. Nothing is
    cut inside such a text, so a reader's redaction of cut edges still
    covers every cut.

    Returns (text, cut_start, cut_end): whether the start or the end of the
    text was cut off to keep it within MAX_MSG.
    """
    msg = _text(result.get("msg")).strip()
    if msg:
        err = _text(result.get("stderr")).strip()
        both = msg + "\n" + err
        if err and err not in msg and len(both.encode("utf-8")) <= MAX_MSG:
            return both, False, False
        head = _head(msg, MAX_MSG)
        return head, False, head != msg
    for key in ("stderr", "stdout"):
        out = _text(result.get(key)).strip()
        if out:
            tail = _tail(out, MAX_MSG)
            return tail, tail != out, False
    censored = _text(result.get(CENSORED_KEY))
    head = _head(censored, MAX_MSG)
    return head, False, head != censored


class CallbackModule(CallbackBase):
    """Writes autoprovisioner run events as JSON lines."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "autoprov_events"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super(CallbackModule, self).__init__(display=display)
        self._path = os.environ.get("AUTOPROV_EVENTS_PATH", "")
        self._out = None
        self._broken = not self._path
        self._seq = 0
        self._playbook = ""
        self._play = ""
        self._gate_path = os.environ.get("AUTOPROV_GATE_PATH", "")

    # ---- output -------------------------------------------------------

    def _open(self):
        path = self._path
        # A descriptor the runner passed (/dev/fd/N): use it, do not reopen
        # it. Reopening a pipe through /proc checks the pipe's owner, which
        # is not the play's user when plays run as another user.
        m = re.match(r"^/dev/fd/([0-9]+)$", path)
        if m:
            return os.fdopen(os.dup(int(m.group(1))), "ab", buffering=0)
        try:
            st = os.stat(path)
            is_fifo = stat.S_ISFIFO(st.st_mode)
        except OSError:
            is_fifo = False
        if not is_fifo:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            return os.fdopen(fd, "ab", buffering=0)
        # A FIFO: wait (bounded) for a reader instead of blocking forever,
        # then switch back to blocking writes so no line is dropped.
        deadline = time.monotonic() + FIFO_OPEN_TIMEOUT
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                break
            except OSError as e:
                if e.errno != errno.ENXIO or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab", buffering=0)

    def _emit(self, event, **fields):
        if self._broken:
            return
        try:
            if self._out is None:
                self._out = self._open()
            self._seq += 1
            record = {"v": VERSION, "seq": self._seq, "ts": _now(), "event": event, "playbook": self._playbook}
            if self._play:
                record["play"] = self._play
            record.update(fields)
            self._out.write(self._encode(record))
        except Exception:  # pylint: disable=broad-except
            # Events are a side channel: never break the play for them.
            self._broken = True
            try:
                if self._out is not None:
                    self._out.close()
            except Exception:  # pylint: disable=broad-except
                pass
            self._out = None

    @staticmethod
    def _encode(record):
        def dump(rec):
            return (json.dumps(rec, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")

        line = dump(record)
        if len(line) <= MAX_LINE:
            return line
        # Too long: shorten msg first, then every other string field.
        over = len(line) - MAX_LINE
        if record.get("msg"):
            msg = record["msg"].encode("utf-8")
            record["msg"] = msg[: max(0, len(msg) - over - 64)].decode("utf-8", "ignore")
            record["msg_cut_end"] = True
            line = dump(record)
        for key in ("task", "play", "playbook", "action", "host"):
            if len(line) <= MAX_LINE:
                break
            if isinstance(record.get(key), str):
                record[key] = _head(record[key], 1024)
                line = dump(record)
        if len(line) > MAX_LINE and "custom" in record:
            del record["custom"]
            record["custom_truncated"] = True
            line = dump(record)
        if len(line) > MAX_LINE and "hosts" in record:
            record["hosts"] = {}
            record["truncated"] = True
            line = dump(record)
        return line

    # ---- helpers ------------------------------------------------------

    @staticmethod
    def _task_fields(task):
        try:
            return {"task": task.get_name().strip(), "action": task.action or ""}
        except Exception:  # pylint: disable=broad-except
            return {"task": "", "action": ""}

    def _result_fields(self, result):
        res = result._result if isinstance(result._result, dict) else {}
        fields = self._task_fields(result._task)
        fields["host"] = result._host.get_name()
        fields["changed"] = bool(res.get("changed", False))
        msg, cut_start, cut_end = _short_msg(res)
        if msg:
            fields["msg"] = msg
            if cut_start:
                fields["msg_cut_start"] = True
            if cut_end:
                fields["msg_cut_end"] = True
        rc = res.get("rc")
        if isinstance(rc, int) and not isinstance(rc, bool):
            fields["rc"] = rc
        return fields

    # ---- callbacks ----------------------------------------------------

    def v2_playbook_on_start(self, playbook):
        try:
            self._playbook = os.path.basename(playbook._file_name)
        except Exception:  # pylint: disable=broad-except
            self._playbook = ""
        self._emit("playbook_start")

    def _wait_at_gate(self):
        """Blocks until the runner opens the gate; exits if it closes it."""
        path, self._gate_path = self._gate_path, ""
        if not path:
            return
        word = b""
        try:
            with open(path, "rb") as gate:
                word = gate.readline().strip()
        except Exception:  # pylint: disable=broad-except
            pass
        if word != b"go":
            # Not a callback error Ansible would only warn about: no task
            # may run, so the process ends here.
            os._exit(GATE_CLOSED_EXIT)  # pylint: disable=protected-access

    def v2_playbook_on_play_start(self, play):
        self._wait_at_gate()
        try:
            self._play = play.get_name().strip()
        except Exception:  # pylint: disable=broad-except
            self._play = ""
        self._emit("play_start")

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._emit("task_start", **self._task_fields(task))

    def v2_playbook_on_handler_task_start(self, task):
        self._emit("handler_start", **self._task_fields(task))

    def v2_runner_on_ok(self, result):
        self._safe_result("host_ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._safe_result("host_failed", result, ignore_errors=bool(ignore_errors))

    def v2_runner_on_unreachable(self, result):
        self._safe_result("host_unreachable", result)

    def v2_runner_on_skipped(self, result):
        self._safe_result("host_skipped", result)

    def _safe_result(self, event, result, **extra):
        try:
            fields = self._result_fields(result)
        except Exception:  # pylint: disable=broad-except
            fields = {}
        if event == "host_skipped":
            for key in ("msg", "msg_cut_start", "msg_cut_end"):
                fields.pop(key, None)
        fields.update(extra)
        self._emit(event, **fields)

    def v2_playbook_on_stats(self, stats):
        hosts = {}
        try:
            for host in sorted(stats.processed.keys()):
                s = stats.summarize(host)
                hosts[host] = {
                    "ok": s.get("ok", 0),
                    "changed": s.get("changed", 0),
                    "failed": s.get("failures", 0),
                    "unreachable": s.get("unreachable", 0),
                    "skipped": s.get("skipped", 0),
                    "rescued": s.get("rescued", 0),
                    "ignored": s.get("ignored", 0),
                }
        except Exception:  # pylint: disable=broad-except
            pass
        fields = {"hosts": hosts}
        # set_stats data of the whole run (per_host: false, the default):
        # a job's artifacts, handed to the next steps of a workflow.
        try:
            custom = stats.custom.get("_run") if isinstance(stats.custom, dict) else None
            if isinstance(custom, dict) and custom:
                fields["custom"] = custom
        except Exception:  # pylint: disable=broad-except
            pass
        self._emit("stats", **fields)
        if self._out is not None:
            try:
                self._out.close()
            except Exception:  # pylint: disable=broad-except
                pass
            self._out = None
