#!/usr/bin/python3
"""Write msgpack vectors the way Python producers write them.

Run with Debian's python3 (it has python3-msgpack):

    /usr/bin/python3 testdata/python/gen_vectors.py testdata/python

The Go tests decode every vector and check the result, and check that this
script still writes exactly the checked-in files. The vectors differ from the
canonical Go encoding on purpose: keys in another order, integers of other
widths (as other msgpack libraries write them), unknown keys of every type,
nil values, schema_version absent, and the old msgpack spec's raw strings.
"""

import os
import struct
import sys

import msgpack


class Raw:
    """Bytes written into a map as they are (an already encoded value)."""

    def __init__(self, data):
        self.data = data


def uint16(n):
    return Raw(struct.pack(">BH", 0xCD, n))


def uint32(n):
    return Raw(struct.pack(">BI", 0xCE, n))


def uint64(n):
    return Raw(struct.pack(">BQ", 0xCF, n))


def int8(n):
    return Raw(struct.pack(">Bb", 0xD0, n))


def int64(n):
    return Raw(struct.pack(">Bq", 0xD3, n))


def pack_map(items, use_bin_type=True):
    """Pack (key, value) pairs as a map, in the given order."""
    packer = msgpack.Packer(use_bin_type=use_bin_type)
    out = bytearray(packer.pack_map_header(len(items)))
    for key, value in items:
        out += packer.pack(key)
        out += value.data if isinstance(value, Raw) else packer.pack(value)
    return bytes(out)


def vectors():
    # A ProvisionerMessage as a Python agent writes it: a dict packed as is,
    # schema_version absent, a +00:00 offset from datetime.isoformat(),
    # unknown keys (nested too) and None values.
    yield "provisioner_message.msgpack", msgpack.packb(
        {
            "server_handle": "vps-101.example",
            "is_recovery": True,
            "correlation_id": "agent-7/run-42",
            "created_at": "2024-05-01T12:00:00.123456+00:00",
            "job_id": "0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10",
            "priority": 5,
            "labels": {"team": "ops", "tags": ["a", "b"], "weight": 1.5},
            "note": None,
            "force_reinstall": None,
        },
        use_bin_type=True,
    )

    # An AnsibleDeployMessage with integers of other widths, an upper-case
    # UUID, a non-canonical IPv6 address, no branch, no job_id, and unknown
    # keys holding binary, extension and float values.
    yield "ansible_deploy_message.msgpack", pack_map(
        [
            ("port", uint16(22)),
            ("server_ip", "2001:DB8:0:0:0:0:0:1"),
            ("project_id", "3F2504E0-4F89-41D3-9A0C-0305E82C3301"),
            ("blob", b"\x00\x01\x02"),
            ("repo_full_name", "octo-org/hello.world"),
            ("modules", ["nginx", "php-fpm", "app_1"]),
            ("schema_version", int64(1)),
            ("ext", msgpack.ExtType(42, b"xyz")),
            ("github_token_ref", "vault:secret/data/ci#github_token"),
            ("ratio", 0.25),
            ("secrets_ref", "file:/run/secrets/app.env"),
        ]
    )

    # The same kind of message packed with the old msgpack spec (raw strings,
    # use_bin_type=False), as old msgpack-python versions did by default.
    yield "ansible_deploy_message_old_spec.msgpack", msgpack.packb(
        {
            "job_id": "deploy-2024-05-01-0001",
            "project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
            "repo_full_name": "acme/shop",
            "branch": "release/2024.05",
            "server_ip": "198.51.100.7",
            "port": 2222,
            "schema_version": 1,
        },
        use_bin_type=False,
    )

    # A failed AnsibleDeployResult with wide integers and an unknown key.
    yield "ansible_deploy_result.msgpack", pack_map(
        [
            ("status", "failed"),
            ("job_id", "deploy-2024-05-01-0001"),
            ("request_id", "1714564800000-0"),
            ("worker", "infra-2"),
            ("project_id", "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"),
            ("server_ip", "198.51.100.7"),
            ("port", uint32(2222)),
            ("playbook", "deploy.yml"),
            (
                "error",
                {"kind": "playbook_failed", "message": "task failed on 1 host"},
            ),
            (
                "hosts",
                {"198.51.100.7": {"ok": 12, "changed": 3, "failed": 1, "skipped": 0}},
            ),
            (
                "failed_task",
                {
                    "name": "Install packages",
                    "host": "198.51.100.7",
                    "play": "Deploy",
                    "message": "No package matching 'php9' is available",
                },
            ),
            ("started_at", "2024-05-01T12:00:00.000Z"),
            ("finished_at", "2024-05-01T12:01:30.500Z"),
            ("duration_ms", uint32(90500)),
            ("output_tail", "TASK [Install packages]\nfatal: [198.51.100.7]: FAILED!\n"),
            ("attempt", int8(2)),
        ]
    )

    # A ProgressEvent with a 64-bit seq and an unknown key.
    yield "progress_event.msgpack", pack_map(
        [
            ("type", "host_failed"),
            ("seq", uint64(17)),
            ("job_id", "deploy-2024-05-01-0001"),
            ("time", "2024-05-01T12:01:29.875Z"),
            ("play", "Deploy"),
            ("task", "Install packages"),
            ("host", "198.51.100.7"),
            ("message", "No package matching 'php9' is available"),
            ("stdout_lines", 3),
        ]
    )

    # A mistake a producer makes: the port as a string. The decoder must name
    # the key, and still read job_id so the rejection can be matched.
    yield "ansible_deploy_message_port_string.msgpack", msgpack.packb(
        {
            "job_id": "deploy-bad-port",
            "project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
            "repo_full_name": "acme/shop",
            "server_ip": "198.51.100.7",
            "port": "22",
        },
        use_bin_type=True,
    )


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    for name, data in vectors():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
