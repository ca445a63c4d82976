# Stops the remote processes of autoprovisioner runs on a target (see
# remote.go). Run as root (sudo -n) when the login user is not root, with
# python3 reading this file from stdin:
#
#   python3 - MODE MARKER GRACE_SECONDS
#
# MARKER is "<scope>.<run>": scope names the target, run the run. Every
# module Ansible starts for a run runs under
# "/usr/bin/env AUTOPROV_RUN=<marker> python3", so the module process and
# everything it starts carry the marker in their environment.
#
# MODE "takeover" stops the tasks of EARLIER runs of the scope (marker of the
# scope, run != RUN); "cleanup" stops the tasks of run RUN itself (after its
# controller stopped the play). Both then remove the scope's remote tmp dir
# ~/.ansible/tmp/autoprov-<scope>, shared by its runs (one at a time: the
# caller holds the server, and a takeover ends before the run's first task).
#
# A task is a module process (marked, its command line "python3" alone or
# "python3 .../AnsiballZ_*.py") whose parent is not marked. What is stopped:
# the task's process, its descendants, and the members of its process group
# and session (the shell, sudo and children of that SSH channel). Processes
# a finished task left behind on purpose (a daemon that detached) are not
# tasks and are left alone. SIGTERM first; SIGKILL after GRACE_SECONDS.
#
# Prints one JSON object: stopped (processes signalled), killed (of them,
# needed SIGKILL), left (still alive), runs (the runs whose tasks were
# stopped), dirs (remote tmp dirs removed), privileged (ran as root).
import glob
import json
import os
import pwd
import shutil
import signal
import sys
import time

NAME = b"AUTOPROV_RUN="


def read_procs():
    """pid -> (ppid, pgrp, sid, starttime, marker, argv, state)"""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                st = f.read()
            f2 = st[st.rindex(b")") + 2:].split()
            state, ppid, pgrp, sid, start = f2[0], int(f2[1]), int(f2[2]), int(f2[3]), int(f2[19])
        except (OSError, ValueError, IndexError):
            continue
        marker = None
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                for kv in f.read().split(b"\0"):
                    if kv.startswith(NAME):
                        marker = kv[len(NAME):].decode("ascii", "replace")
                        break
        except OSError:
            pass
        argv = []
        if marker is not None:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            except OSError:
                pass
        out[pid] = (ppid, pgrp, sid, start, marker, argv, state)
    return out


def is_module(argv):
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return False
    return len(argv) == 1 or "AnsiballZ_" in os.path.basename(argv[1])


def select(procs, scope, run, mode):
    """The processes to stop, as {pid: starttime}, and the runs they belong to."""
    me = os.getpid()
    own = {me, os.getppid(), 1}
    mysid, mypgrp = os.getsid(0), os.getpgrp()

    def chosen(marker):
        if not marker or "." not in marker:
            return False
        s, r = marker.split(".", 1)
        if s != scope:
            return False
        return r != run if mode == "takeover" else r == run

    tasks = set()
    for pid, p in procs.items():
        parent = procs.get(p[0])
        if chosen(p[4]) and is_module(p[5]) and not (parent and parent[4] == p[4]):
            tasks.add(pid)
    runs = sorted({procs[p][4].split(".", 1)[1] for p in tasks})
    groups = {procs[p][1] for p in tasks} - {0, 1, mypgrp}
    sessions = {procs[p][2] for p in tasks} - {0, 1, mysid}
    victims = set(tasks)
    for pid, p in procs.items():
        if p[1] in groups or p[2] in sessions:
            victims.add(pid)
    children = {}
    for pid, p in procs.items():
        children.setdefault(p[0], []).append(pid)
    stack = list(victims)
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in victims:
                victims.add(c)
                stack.append(c)
    victims -= own
    return {pid: procs[pid][3] for pid in victims if procs[pid][6] != b"Z"}, runs


def alive(victims):
    """The victims still alive (same start time: not a reused pid), zombies aside."""
    left = {}
    for pid, start in victims.items():
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                st = f.read()
            f2 = st[st.rindex(b")") + 2:].split()
            if int(f2[19]) == start and f2[0] != b"Z":
                left[pid] = start
        except (OSError, ValueError, IndexError):
            pass
    return left


def signal_all(victims, sig):
    for pid in victims:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def wait_gone(victims, seconds):
    deadline = time.monotonic() + seconds
    left = alive(victims)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left


def homes():
    names = {"root"}
    for var in ("SUDO_USER", "USER", "LOGNAME"):
        if os.environ.get(var):
            names.add(os.environ[var])
    out = set()
    for n in names:
        try:
            out.add(pwd.getpwnam(n).pw_dir)
        except KeyError:
            pass
    out.add(os.path.expanduser("~"))
    return out


def remove_dirs(scope):
    """Removes the scope's remote tmp dir (all runs of a scope share it) and
    the per-run dirs "autoprov-<scope>.<run>" of earlier versions."""
    removed = 0
    for home in homes():
        base = os.path.join(home, ".ansible", "tmp", "autoprov-%s" % scope)
        for d in [base] + glob.glob(base + ".*"):
            if not os.path.isdir(d) or os.path.islink(d):
                continue
            shutil.rmtree(d, ignore_errors=True)
            removed += 0 if os.path.exists(d) else 1
    return removed


def main():
    mode, marker, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if mode not in ("takeover", "cleanup") or "." not in marker:
        print(json.dumps({"error": "usage: MODE(takeover|cleanup) SCOPE.RUN GRACE"}))
        return 2
    scope, run = marker.split(".", 1)
    stopped, killed, runs, left = 0, 0, set(), {}
    # A stopped task's parent may have been between forks: look again until
    # a round finds nothing (bounded).
    for _ in range(5):
        victims, rs = select(read_procs(), scope, run, mode)
        if not victims:
            break
        runs.update(rs)
        stopped += len(victims)
        signal_all(victims, signal.SIGTERM)
        left = wait_gone(victims, grace)
        if left:
            killed += len(left)
            signal_all(left, signal.SIGKILL)
            left = wait_gone(left, 10)
        if left:
            break
    print(json.dumps({
        "stopped": stopped, "killed": killed, "left": len(left), "left_pids": sorted(left),
        "runs": sorted(runs), "dirs": remove_dirs(scope), "privileged": os.geteuid() == 0,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
