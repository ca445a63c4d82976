#!/usr/bin/env python3
"""devnull-guard.py: keep /dev/null's mode 0666 while it runs.

Tests run as root, and one of them made the host's /dev/null 0600
(ansible-galaxy chmod'ed its token path, then /dev/null: fixed), after
which initdb (as postgres) and every unprivileged `>/dev/null` of the tests
beside it fail. A net for what else might: this waits on the node's attribute changes (inotify
IN_ATTRIB) and puts the mode back at once, where a polling loop left a
window of its period. Run as root; stops on SIGTERM and with its parent.
"""
import ctypes
import os
import stat
import sys

IN_ATTRIB = 0x00000004
PATH = b"/dev/null"


def mend():
    mode = stat.S_IMODE(os.stat(PATH).st_mode)
    if mode != 0o666:
        os.chmod(PATH, 0o666)
        print(f"warning: /dev/null had mode {mode:o}; set back to 666", file=sys.stderr, flush=True)


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM: ends with the script that started it
    if os.getppid() == 1:
        return
    fd = libc.inotify_init1(0)
    if fd < 0 or libc.inotify_add_watch(fd, PATH, IN_ATTRIB) < 0:
        sys.exit(f"devnull-guard: inotify: {os.strerror(ctypes.get_errno())}")
    mend()
    while True:
        os.read(fd, 4096)
        mend()


if __name__ == "__main__":
    main()
