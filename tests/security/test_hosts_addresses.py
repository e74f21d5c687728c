"""`mm-agent doctor --hosts` with addresses that are no addresses (issue 25, low hole).

Hole guarded here: a fingerprint edited (or written by another tool) with `master.ip` 999.1.1.1 made
`doctor --hosts` print a traceback (`ipaddress.ip_address` raised while comparing). Every address of a
fingerprint is now checked when the file is read: a bad one is an error naming the file, the field and the
fix, exit 2. Real fingerprints written by the CLI, then edited, then compared by the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NODE_VARS = ("MM_ROOT", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "PYTHONPATH")


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in NODE_VARS}
    env["MM_AGENT_STATE_DIR"] = str(tmp_path / "state")
    return subprocess.run(
        [sys.executable, "-m", "mm_agent", "doctor", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("hosts")
    done = _doctor(where, "--fingerprint", str(where / "good.json"), "--check", "shm")
    assert done.returncode in {0, 1}, done.stderr
    return where / "good.json"


def _edited(good: Path, name: str, change: dict[str, Any]) -> Path:
    data = json.loads(good.read_text(encoding="utf-8"))
    data.update(change)
    out = good.parent / name
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


MASTER = {"addr": "node0", "port": 6000, "ip": "10.0.0.1", "status": "refused", "detail": "answered"}
NIC = {"name": "eth0", "up": True, "ipv4": [{"address": "10.0.0.2", "netmask": "255.255.255.0"}]}


@pytest.mark.parametrize(
    ("name", "change", "field"),
    [
        # the reproduction: with a socket IFNAME to check against the master's subnet, this was a traceback
        (
            "master-ip.json",
            {
                "master": {**MASTER, "ip": "999.1.1.1"},
                "nics": [NIC],
                "socket_ifname": {"GLOO_SOCKET_IFNAME": "eth0"},
            },
            "master.ip",
        ),
        ("master-v6.json", {"master": {**MASTER, "ip": "::1"}}, "master.ip"),
        (
            "nic-address.json",
            {"nics": [{**NIC, "ipv4": [{"address": "10.0.0", "netmask": None}]}]},
            "nics.0.ipv4.0.address",
        ),
        (
            "nic-mask.json",
            {"nics": [{**NIC, "ipv4": [{"address": "10.0.0.2", "netmask": "255.0.255.0"}]}]},
            "nics.0.ipv4.0.netmask",
        ),
    ],
)
def test_a_bad_address_is_an_error_naming_file_field_and_fix(
    good: Path, name: str, change: dict[str, Any], field: str
) -> None:
    bad = _edited(good, name, change)
    done = _doctor(good.parent, "--hosts", str(good), str(bad))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert str(bad) in done.stderr and field in done.stderr and "fix:" in done.stderr, done.stderr
    assert "mm-agent doctor --fingerprint" in done.stderr, done.stderr  # how to get a good one


def test_good_addresses_still_compare(good: Path) -> None:
    other = _edited(good, "other.json", {"hostname": "nodeB", "master": MASTER, "nics": [NIC]})
    done = _doctor(good.parent, "--hosts", str(good), str(other))
    assert "Traceback" not in done.stderr and done.returncode in {0, 1}, done.stderr
