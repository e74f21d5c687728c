"""Runs belong to the workspace of the server that started them (issue 25, low hole).

Hole guarded here: every mm-agent server of a user shares one state directory (`runs/` under
MM_AGENT_STATE_DIR), and the run_id tools (job_status, tail_logs, stop_job, diagnose_errors(run_id), the
recover_failed_run prompt) answered for any run in it: a server on workspace B read the logs of, and stopped,
a training started by a server on workspace A. Now each run records its workspace and a server refuses
another workspace's runs with an error naming whose it is and how to reach it (the CLI, or a server on that
workspace); the CLI still sees every run. Real servers (in-process clients), a real torchrun stand-in job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from mm_agent.jobs import job_status, list_jobs, stop_job
from mm_agent.server import build_server
from security.test_job_runs import DEADLINE_S, make_job, ranks, stand_in


@pytest.fixture
def two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Workspaces A and B of one user: one shared state directory, as every server of a user has."""
    monkeypatch.delenv("MM_ROOT", raising=False)
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    return a, b


async def _tool(ws: Path, tool: str, args: dict[str, Any]) -> Any:
    async with Client(build_server(ws)) as client:
        return await client.call_tool(tool, args)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_server_on_another_workspace_neither_reads_nor_stops_a_run(two: tuple[Path, Path]) -> None:
    a, b = two
    job = make_job(a)
    pids = stand_in(job, "train", iters=2000, pause=0.2)

    async def go() -> None:
        with anyio.fail_after(DEADLINE_S):
            started = await _tool(a, "launch_training", {"job_dir": "job", "confirm": True})
            assert not started.is_error, started.content[0].text
            run_id = started.structured_content["run_id"]
            workers = ranks(pids)
            calls = [
                ("job_status", {"run_id": run_id}),
                ("tail_logs", {"run_id": run_id}),
                ("stop_job", {"run_id": run_id, "confirm": True, "timeout_s": 2}),
                ("diagnose_errors", {"run_id": run_id}),
            ]
            for tool, args in calls:
                result = await _tool(b, tool, args)
                assert result.is_error, f"{tool} answered for a run of another workspace"
                text = result.content[0].text
                assert f"run {run_id} belongs to workspace {a}" in text, text
                assert f"mm-agent status {run_id}" in text and "--workspace" in text, text
            async with Client(build_server(b)) as client:
                with pytest.raises(MCPError) as err:
                    await client.get_prompt("recover_failed_run", {"run_id": run_id})
                assert err.value.code == INVALID_PARAMS and str(a) in err.value.message
            assert all(_alive(pid) for pid in workers), "a server on B stopped A's run"
            # the CLI (no workspace) sees every run; the server on A still answers for its own
            assert job_status(run_id).state == "running"
            assert run_id in [r.run_id for r in list_jobs().jobs]
            own = await _tool(a, "job_status", {"run_id": run_id})
            assert not own.is_error, own.content[0].text
            stopped = await _tool(a, "stop_job", {"run_id": run_id, "confirm": True, "timeout_s": 5})
            assert not stopped.is_error, stopped.content[0].text
            end = time.monotonic() + DEADLINE_S
            while any(_alive(pid) for pid in workers):
                assert time.monotonic() < end, "the run's own server could not stop it"
                await anyio.sleep(0.1)

    try:
        anyio.run(go)
    finally:  # a failing test leaves nothing running: stop every run of this state dir (as the CLI would)
        for run in list_jobs().jobs:
            if run.state == "running" or run.orphans:
                stop_job(run.run_id, confirm=True, timeout_s=2)
