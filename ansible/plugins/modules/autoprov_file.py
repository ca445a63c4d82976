#!/usr/bin/python
# -*- coding: utf-8 -*-
# autoprov_file: write a file from a module argument in one round trip.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: autoprov_file
short_description: Write a file from content, atomically, in one module call
description:
  - Writes I(content) to I(dest) with the given mode and owner, replacing the
    file atomically (temporary file in the same directory, optional
    validation, fsync, rename) and only when the content or the metadata
    differ.
  - One module call per file, where M(ansible.builtin.template) and
    M(ansible.builtin.copy) need two (stat, then file or copy) even when
    nothing changes; render templates with the C(template) lookup.
  - The content never goes through a temporary file on the controller; with
    SSH pipelining it travels only inside the module arguments on the SSH
    channel, which suits secrets (run such tasks with C(no_log)).
  - The temporary file is created with mode 0600 before any byte is written.
  - Never returns the content.
options:
  content:
    description: The file content.
    type: str
    required: true
  dest:
    description: Absolute path of the file.
    type: path
    required: true
  mode:
    description: Octal permission bits as a string.
    type: str
    default: "0600"
  owner:
    description: Owner name (default the current user).
    type: str
  group:
    description: Group name (default the owner's group).
    type: str
  validate:
    description:
      - Command run on the new content before it replaces I(dest); C(%s) is
        the path of the temporary file. Split like a shell would, not run by one.
    type: str
  parents:
    description:
      - Create missing parent directories, owned by I(owner) and I(group),
        with mode I(parent_mode). Existing directories are left alone.
    type: bool
    default: false
  parent_mode:
    description: Octal mode of the parent directories created.
    type: str
    default: "0755"
"""

EXAMPLES = r"""
- name: Write the hardening drop-in
  autoprov_file:
    content: "{{ lookup('ansible.builtin.template', 'hardening.conf.j2') }}"
    dest: /etc/ssh/sshd_config.d/00-autoprov-hardening.conf
    mode: "0644"
    validate: /usr/sbin/sshd -t -f %s

- name: Write the project's .env
  autoprov_file:
    content: "{{ lookup('ansible.builtin.env', 'PROJECT_ENV') }}"
    dest: /srv/app/shared/.env
    mode: "0600"
  no_log: true
"""

RETURN = r"""
dest:
  description: The path written.
  type: str
  returned: always
"""

import grp
import hashlib
import os
import pwd
import shlex
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _digest_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(65536), b""):
            h.update(chunk)
    return h.digest()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            content=dict(type="str", required=True, no_log=True),
            dest=dict(type="path", required=True),
            mode=dict(type="str", default="0600"),
            owner=dict(type="str"),
            group=dict(type="str"),
            validate=dict(type="str"),
            parents=dict(type="bool", default=False),
            parent_mode=dict(type="str", default="0755"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    dest = p["dest"]
    if not os.path.isabs(dest):
        module.fail_json(msg="dest must be an absolute path")
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg="mode must be an octal string such as 0600")
    try:
        uid = pwd.getpwnam(p["owner"]).pw_uid if p["owner"] else os.geteuid()
        gid = grp.getgrnam(p["group"]).gr_gid if p["group"] else pwd.getpwuid(uid).pw_gid
    except KeyError as e:
        module.fail_json(msg="unknown owner or group: %s" % e)

    data = p["content"].encode("utf-8")
    want = hashlib.sha256(data).digest()
    same_content = same_meta = False
    if p["parents"] and module.check_mode and not os.path.isdir(os.path.dirname(dest)):
        module.exit_json(changed=True, dest=dest)
    if os.path.lexists(dest):
        if os.path.islink(dest) or not os.path.isfile(dest):
            module.fail_json(msg="%s exists and is not a regular file" % dest)
        st = os.stat(dest)
        same_meta = (st.st_mode & 0o7777) == mode and st.st_uid == uid and st.st_gid == gid
        same_content = _digest_file(dest) == want
    if same_content and same_meta:
        module.exit_json(changed=False, dest=dest)
    if module.check_mode:
        module.exit_json(changed=True, dest=dest)

    if same_content:
        os.chown(dest, uid, gid)
        os.chmod(dest, mode)
        module.exit_json(changed=True, dest=dest)

    directory = os.path.dirname(dest)
    if not os.path.isdir(directory):
        if not p["parents"]:
            module.fail_json(msg="directory %s does not exist" % directory)
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            os.mkdir(d)
            os.chown(d, uid, gid)
            os.chmod(d, int(p["parent_mode"], 8))
    fd, tmp = tempfile.mkstemp(prefix=".autoprov-", dir=directory)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        if p["validate"]:
            if "%s" not in p["validate"]:
                raise ValueError("validate must contain %s")
            argv = [a.replace("%s", tmp) for a in shlex.split(p["validate"])]
            rc, out, err = module.run_command(argv)
            if rc != 0:
                os.unlink(tmp)
                module.fail_json(msg="failed to validate", rc=rc, stdout=out, stderr=err)
        os.rename(tmp, dest)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except (OSError, ValueError) as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        module.fail_json(msg="write %s: %s" % (dest, e))
    module.exit_json(changed=True, dest=dest)


if __name__ == "__main__":
    main()
