#!/usr/bin/python
# -*- coding: utf-8 -*-
# autoprov_git_fetch: fetch one branch over HTTPS with a token that never
# reaches argv, disk or output, and export the commit as a release directory.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: autoprov_git_fetch
short_description: Fetch a branch with a bearer token and export it as a release
description:
  - Keeps a bare repository at I(git_dir) and fetches the tip of I(branch) from
    I(url) into it (shallow, no tags).
  - The token is handed to git as an C(http.extraheader) through the
    C(GIT_CONFIG_COUNT)/C(GIT_CONFIG_KEY_n)/C(GIT_CONFIG_VALUE_n) environment of
    the git process only. It is never put on a command line, in C(.git/config),
    in a file or in the module output. With SSH pipelining (our ansible.cfg) the
    module arguments travel only on the SSH channel.
  - When I(releases_dir) is set, the fetched commit is exported (C(git archive),
    no C(.git) directory) to C(releases_dir/<commit>) unless that directory
    already exists.
  - Changed when the fetched commit differs from the previous fetch or a release
    directory was created.
options:
  url:
    description: HTTPS (or HTTP, for tests) URL of the repository.
    type: str
    required: true
  branch:
    description: Branch to fetch; must be a valid branch name.
    type: str
    required: true
  git_dir:
    description: Path of the bare repository kept between deploys.
    type: path
    required: true
  token:
    description:
      - Token sent as HTTP basic credentials C(x-access-token:<token>), the form
        GitHub accepts for installation and personal access tokens. Empty for a
        public repository.
    type: str
    default: ""
  releases_dir:
    description: Directory under which the commit is exported.
    type: path
  stall_timeout:
    description: Seconds of transfer below 1 KiB/s after which git gives up.
    type: int
    default: 60
"""

RETURN = r"""
commit:
  description: The fetched commit.
  type: str
  returned: success
previous_commit:
  description: The commit of the previous fetch, empty on the first one.
  type: str
  returned: success
release_dir:
  description: The export directory (when releases_dir is set).
  type: str
  returned: when releases_dir is set
"""

import base64
import io
import os
import re
import shutil
import tarfile

from ansible.module_utils.basic import AnsibleModule

REF = "refs/autoprov/deploy"
SHA_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


# Variables that make git trace its HTTP traffic (GIT_CURL_VERBOSE turns
# curl's tracing on whatever its value, "0" included), skip TLS checks or
# inject configuration. They are removed from the module's environment (which
# git inherits), never set: the token travels in a header.
_UNSAFE_GIT_ENV = ("GIT_CURL_VERBOSE", "GIT_SSL_NO_VERIFY", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_GLOBAL",
                   "GIT_CONFIG_SYSTEM", "GIT_ASKPASS", "GIT_SSH_COMMAND", "GIT_PROXY_COMMAND")


def _scrub_environ():
    for name in list(os.environ):
        if name in _UNSAFE_GIT_ENV or name.startswith("GIT_TRACE"):
            del os.environ[name]


def _git_env(token):
    env = {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GCM_INTERACTIVE": "never",
        "GIT_TRACE": "0",
        "GIT_TRACE_CURL": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        # No user configuration either (a credential helper, sslVerify=false).
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "LC_ALL": "C",
    }
    if token:
        cred = base64.b64encode(("x-access-token:%s" % token).encode("utf-8")).decode("ascii")
        env.update(
            {
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "http.extraheader",
                "GIT_CONFIG_VALUE_0": "Authorization: Basic %s" % cred,
            }
        )
    return env


class Git:
    def __init__(self, module, git_dir, token, stall_timeout):
        self.module = module
        self.git = module.get_bin_path("git", required=True)
        self.git_dir = git_dir
        self.env = _git_env(token)
        self.stall_timeout = stall_timeout

    def run(self, args, check=True, binary=False):
        # credential.helper= drops any helper configured for the user: the
        # token comes from the header only and is never stored.
        cmd = [
            self.git,
            "-c", "credential.helper=",
            "-c", "http.lowSpeedLimit=1024",
            "-c", "http.lowSpeedTime=%d" % self.stall_timeout,
            "--git-dir", self.git_dir,
        ] + args
        kwargs = {"environ_update": self.env, "check_rc": False}
        if binary:
            kwargs["encoding"] = None
        rc, out, err = self.module.run_command(cmd, **kwargs)
        if check and rc != 0:
            if isinstance(err, bytes):
                err = err.decode("utf-8", "replace")
            self.module.fail_json(msg="git %s failed: %s" % (args[0], err.strip()[-2000:]), rc=rc)
        return rc, out, err

    def rev(self, ref):
        rc, out, _ = self.run(["rev-parse", "--verify", "--quiet", ref + "^{commit}"], check=False)
        return out.strip() if rc == 0 else ""


def _extract(module, git, commit, dest):
    tmp = dest + ".partial"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp, mode=0o755)
    _, out, _ = git.run(["archive", "--format=tar", commit], binary=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:
            for member in tar.getmembers():
                name = os.path.normpath(member.name)
                if name.startswith("..") or os.path.isabs(name):
                    module.fail_json(msg="unsafe path in archive: %s" % member.name)
            tar.extractall(tmp)  # nosec: member paths checked above
    except tarfile.TarError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        module.fail_json(msg="extract %s: %s" % (commit, e))
    os.rename(tmp, dest)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            branch=dict(type="str", required=True),
            git_dir=dict(type="path", required=True),
            token=dict(type="str", default="", no_log=True),
            releases_dir=dict(type="path"),
            stall_timeout=dict(type="int", default=60),
        ),
        supports_check_mode=False,
    )
    _scrub_environ()
    p = module.params
    url, branch = p["url"], p["branch"]
    if not re.match(r"^https?://[^\s@]+$", url):
        module.fail_json(msg="url must be an http(s) URL without credentials")
    if branch.startswith("-") or not re.match(r"^[A-Za-z0-9._/-]{1,200}$", branch):
        module.fail_json(msg="invalid branch name")

    changed = False
    git_dir = p["git_dir"]
    git = Git(module, git_dir, p["token"], p["stall_timeout"])
    if not os.path.exists(os.path.join(git_dir, "HEAD")):
        os.makedirs(git_dir, mode=0o700, exist_ok=True)
        git.run(["init", "--bare", "--quiet"])
        changed = True
    rc, _, _ = git.run(["check-ref-format", "--branch", branch], check=False)
    if rc != 0:
        module.fail_json(msg="invalid branch name")

    previous = git.rev(REF)
    git.run(
        [
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--depth=1",
            "--force",
            url,
            "+refs/heads/%s:%s" % (branch, REF),
        ]
    )
    commit = git.rev(REF)
    if not SHA_RE.match(commit):
        module.fail_json(msg="fetch of %s did not produce a commit" % branch)
    if commit != previous:
        changed = True

    result = dict(commit=commit, previous_commit=previous)
    if p["releases_dir"]:
        release = os.path.join(p["releases_dir"], commit)
        if not os.path.isdir(release):
            os.makedirs(p["releases_dir"], mode=0o755, exist_ok=True)
            _extract(module, git, commit, release)
            changed = True
        result["release_dir"] = release
    # Keep the bare repository small: only the deployed ref matters.
    if changed:
        git.run(["gc", "--quiet", "--prune=now", "--auto"], check=False)
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
