"""One small real `mm-agent demo` run, shared by the tests that need a job with real weights, a converted
checkpoint and extracted features (tests/test_demo.py, tests/test_multinode_jobs.py) through the session
fixture `demo` in conftest.py: the demo takes about a minute on two cores, so it runs once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mm_agent.demo import DemoReport

CLIPS, ITERS = 4, 40


def cli() -> list[str]:
    exe = Path(sys.executable).with_name("mm-agent")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "mm_agent"]


def demo_cli(root: Path, *flags: str) -> tuple[DemoReport, subprocess.CompletedProcess[str]]:
    """`mm-agent demo --json --dir <root>/demo FLAGS` in a subprocess with its own state dir under `root`."""
    env = {**os.environ, "MM_AGENT_STATE_DIR": str(root / "state")}
    argv = [*cli(), "demo", "--json", "--dir", str(root / "demo"), *flags]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert proc.stdout, proc.stderr[-3000:]
    return DemoReport.model_validate_json(proc.stdout), proc


def run_demo_cli(root: Path) -> tuple[DemoReport, subprocess.CompletedProcess[str]]:
    """The Wan demo, small (CLIPS clips, ITERS iterations)."""
    return demo_cli(root, "--clips", str(CLIPS), "--iters", str(ITERS))
