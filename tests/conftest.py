"""Fixtures shared by test files."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from demorun import run_demo_cli

from mm_agent.demo import DemoReport
from mm_agent.jobs import list_jobs, stop_job
from mm_agent.runs import runs_dir
from mm_agent.workspace import set_workspace

# A shell without job control starts background commands (`.ci/run &`) with SIGINT ignored, and children
# inherit that: the CLI under test would then never see the Ctrl-C the tests send it. Handled (not ignored)
# here, SIGINT is back to its default in every process the tests start, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _registry_workspace() -> Iterator[None]:
    """`build_server` and the new-model demo set the registry's workspace process-wide: no test inherits one."""
    yield
    set_workspace(None)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes this test started; whatever is still running at the end is killed (they are ours)."""
    children: list[subprocess.Popen[bytes]] = []
    yield children
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Workspace (also the cwd) with a private state dir; runs a test left running are stopped (they are ours)."""
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    yield root
    if runs_dir().is_dir():
        for run in list_jobs().jobs:
            if run.state == "running" or run.pids:
                stop_job(run.run_id, confirm=True, timeout_s=2)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoReport, subprocess.CompletedProcess[str]]:
    """One real demo run for the whole session (tests/demorun.py)."""
    return run_demo_cli(tmp_path_factory.mktemp("demo"))
