"""Multi-node for real on one machine (issue 16, item 1): the bundled runtime's training as `torchrun --nnodes
2` on gloo, one node per network namespace (tests/twohosts.py), equals the same global batch on one host.
Skipped, with the reason, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_runtime_train import ROOT, env, losses, torchrun, train_args, write_job
from twohosts import Host, node_argv, two_hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


def node(host: Host, rank: int, master: Host, port: int, job: Path, save: Path) -> subprocess.Popen[str]:
    argv = [*node_argv(host, rank, master, port), *train_args(job, save)]
    return subprocess.Popen(
        argv,
        env=env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_two_nodes_train_exactly_as_one_host(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job")
    one = subprocess.run(
        [*torchrun(2), *train_args(job, tmp_path / "one")],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    with two_hosts() as (a, b):
        port = 29000 + os.getpid() % 900
        nodes = [node(a, 0, a, port, job, tmp_path / "two"), node(b, 1, a, port, job, tmp_path / "two")]
        try:
            done = [p.communicate(timeout=300) for p in nodes]
        finally:
            for p in nodes:  # a node left waiting for its peer is ours to end
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=30)
    assert [p.returncode for p in nodes] == [0, 0], [err[-2000:] for _, err in done]
    assert losses(tmp_path / "two") == losses(tmp_path / "one")  # the same global batch, bit for bit
