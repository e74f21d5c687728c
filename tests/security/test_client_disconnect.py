"""A client that goes away, or cancels a call, leaves no contained process running (issue 25, low-medium).

`contained.py` starts the doctor's probes (`npu-smi`, the interpreter probes) in process groups of their
own, so that a timeout can kill all they started; but when the client closed stdin, or sent
`notifications/cancelled` for the call, those groups ran on to their own deadline (and past the server's
exit). Now a cancelled call's token kills its contained groups at once, and the server's shutdown kills
every group still listed. A stand-in `npu-smi` on PATH backgrounds a sleeper and then hangs, as in
`test_doctor_hardening.py`; a real stdio server runs `check_environment` with a 60 s check timeout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from security.serverproc import HANG_GUARD_S, Stdio, alive, eventually, group_members, kill

SETTLE_S = 30  # far more than killing a process group takes; the probe itself would hang for 60 s


@pytest.fixture
def hanging_npu_smi(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PATH with an npu-smi that starts a sleeper, writes `<its pid> <sleeper pid>`, then hangs."""
    pidfile = tmp_path / "pids"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(
        f'#!/bin/sh\nsleep 600 >/dev/null 2>&1 &\necho "$$ $!" > {pidfile}.tmp\nmv {pidfile}.tmp {pidfile}\n'
        "exec sleep 600\n",
        encoding="utf-8",
    )
    (bin_dir / "npu-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, pidfile


def _start_probe(tmp_path: Path, env: dict[str, str], pidfile: Path) -> tuple[Stdio, list[int]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    server = Stdio(ws, tmp_path / "state", env=env)
    server.call("doctor", "check_environment", {"checks": ["npu_devices"], "timeout_s": 60})
    eventually(pidfile.exists, "npu-smi started")
    pids = [int(p) for p in pidfile.read_text(encoding="utf-8").split()]
    assert all(alive(p) for p in pids)
    return server, pids


def _gone(pids: list[int]) -> bool:
    return not any(alive(p) for p in pids) and not group_members(pids[0])


@pytest.fixture
def reap() -> object:
    """Pids a test recorded; anything still alive at the end is killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            kill(pid)


def test_closing_stdin_kills_the_running_probe(
    tmp_path: Path, hanging_npu_smi: tuple[dict[str, str], Path], reap: list[int]
) -> None:
    server, pids = _start_probe(tmp_path, *hanging_npu_smi)
    reap.extend(pids)
    try:
        server.close_stdin()
        assert server.proc.wait(HANG_GUARD_S) == 0, "the server did not exit cleanly when stdin closed"
        eventually(lambda: _gone(pids), f"npu-smi's group {pids} still running", SETTLE_S)
    finally:
        server.stop()


@pytest.mark.parametrize("then_close", [False, True])
def test_cancelling_the_call_kills_its_probe(
    tmp_path: Path, hanging_npu_smi: tuple[dict[str, str], Path], reap: list[int], then_close: bool
) -> None:
    """notifications/cancelled for the running call ends its probe at once (the server stays up and
    answers the next call); cancelling and then closing stdin leaves nothing either."""
    server, pids = _start_probe(tmp_path, *hanging_npu_smi)
    reap.extend(pids)
    try:
        server.cancel("doctor")
        if then_close:
            server.close_stdin()
            assert server.proc.wait(HANG_GUARD_S) == 0
        eventually(lambda: _gone(pids), f"npu-smi's group {pids} still running", SETTLE_S)
        if not then_close:
            server.call("after", "list_models", {})
            assert "result" in server.reply("after")
    finally:
        server.stop()
