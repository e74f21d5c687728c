"""Two hosts on one machine: two network namespaces joined by a veth pair, each with its own address, so a
multi-node launch (torchrun --nnodes 2, gloo) really crosses a network between "nodes". Used by
tests/test_multinode_netns.py and benchmarks/multinode.py; needs root and iproute2 (`ip`), and says why not
when they are missing. The namespaces are removed on the way out, whatever happened inside."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

SUBNET = "10.77.{}.{}"


@dataclass(frozen=True)
class Host:
    ns: str
    dev: str
    ip: str

    def argv(self, command: list[str]) -> list[str]:
        """`command` run inside this host's namespace (its only interfaces: lo and its end of the veth)."""
        return ["ip", "netns", "exec", self.ns, *command]


def node_argv(host: Host, rank: int, master: Host, port: int) -> list[str]:
    """One node of a 2-node `runtime.train` (1 rank per node) in `host`'s namespace, gloo bound to its NIC;
    the training arguments follow."""
    launch = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
        f"--master_addr={master.ip}", f"--master_port={port}", "-m", "runtime.train",
    ]  # fmt: skip
    return host.argv(["env", f"GLOO_SOCKET_IFNAME={host.dev}", *launch])


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why two namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"mmprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    return None if made.returncode == 0 else f"`ip netns add` fails: {made.stderr.strip()}"


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Hosts A (x.x.n.1) and B (x.x.n.2) on a private /24 of their own, named after this process."""
    tag = os.getpid() % 250 + 1
    hosts = (
        Host(f"mmA{os.getpid()}", f"vA{tag}", SUBNET.format(tag, 1)),
        Host(f"mmB{os.getpid()}", f"vB{tag}", SUBNET.format(tag, 2)),
    )
    try:
        for host in hosts:
            _ip("netns", "add", host.ns)
        _ip("link", "add", hosts[0].dev, "type", "veth", "peer", "name", hosts[1].dev)
        for host in hosts:
            _ip("link", "set", host.dev, "netns", host.ns)
            for cmd in (["addr", "add", f"{host.ip}/24", "dev", host.dev], ["link", "set", host.dev, "up"],
                        ["link", "set", "lo", "up"]):  # fmt: skip
                _ip("netns", "exec", host.ns, "ip", *cmd)
        yield hosts
    finally:
        for host in hosts:  # removing a namespace removes its end of the veth, and with it the pair
            _ip("netns", "del", host.ns, check=False)
