"""Ports for a new job: a MASTER_PORT nobody holds, and on Ascend hosts an HCCL host-port range of its own.

Two jobs on one host collide on torchrun's store port (`EADDRINUSE`) and on HCCL's host-NIC listen range
(EI0019, default 60000-60031). A port counts as free when a bind test succeeds *and* no live mm-agent
job has it recorded (a job that has not bound yet still owns its port). The pick and the record that
reserves it happen under one lock file, so two launches at once cannot choose the same port.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

from mm_agent.errors import MMAgentError

HCCL_BASE = 60000  # HCCL_IF_BASE_PORT default
HCCL_SPAN = 32  # host-NIC ports HCCL may bind from its base
MASTER_SCAN = 2000  # ports tried above the preferred one
_LOCK = ".launch.lock"


@contextlib.contextmanager
def launch_lock(runs_dir: Path) -> Iterator[None]:
    """Serialise port picking + run recording across processes (CLI and MCP server alike)."""
    runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(runs_dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def bindable(port: int) -> bool:
    """Nothing listens on `port` on any address (IPv4, and IPv6 where the host has it).

    SO_REUSEADDR, as torch's TCPStore sets it: connections of a finished job left in TIME_WAIT do not stop
    torchrun from binding, so they must not make the port look taken; a listener still does (Linux).
    """
    families = [socket.AF_INET] + ([socket.AF_INET6] if socket.has_ipv6 else [])
    for family in families:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue
            return False
    return True


def pick_master_port(preferred: int, taken: Iterable[int]) -> int:
    """`preferred` when free, else the next free port above it."""
    held = set(taken)
    for port in range(preferred, min(preferred + MASTER_SCAN, 65536)):
        if port not in held and bindable(port):
            return port
    raise MMAgentError(
        f"no free port in {preferred}-{preferred + MASTER_SCAN - 1} for MASTER_PORT",
        field="master_port",
        fix="stop finished jobs that still hold ports (mm-agent jobs; mm-agent doctor names the holders)",
    )


def pick_hccl_base(taken_bases: Iterable[int]) -> int:
    """The first HCCL range (base, base+32) that is bindable and overlaps no live job's range."""
    taken = sorted(taken_bases)
    for base in range(HCCL_BASE, 65536 - HCCL_SPAN, HCCL_SPAN):
        if any(abs(base - other) < HCCL_SPAN for other in taken):
            continue
        if all(bindable(p) for p in range(base, base + HCCL_SPAN)):
            return base
    raise MMAgentError(
        "no free range of 32 ports for HCCL_IF_BASE_PORT",
        field="HCCL_IF_BASE_PORT",
        fix="stop leftover jobs, or set HCCL_HOST_SOCKET_PORT_RANGE=auto (A2/A3) in the job's env",
    )


def npu_host() -> bool:
    """Ascend devices are visible here (HCCL will bind host ports)."""
    return any(Path("/dev").glob("davinci[0-9]*"))
