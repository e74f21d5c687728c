"""The critical repro of issue 12, end to end through a real stdio server: `render_job(model=qwen2.5vl,
task=sft, mm_root="x$(id > FILE)", confirm)` followed by `check_environment(python="<job>/finetune.sh")`
ran `id` as the server's user (the doctor executed the script, whose MM_ROOT default sat in double quotes).
Now the doctor refuses the script, and the rendered script itself runs nothing when bash runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]


def test_render_then_doctor_runs_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    canary = tmp_path / "CANARY"
    hostile = f"x$(id > {canary})`id > {canary}`"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mm_agent", "serve", "--workspace", str(ws)],
        cwd=str(REPO),
        env={**os.environ, "MM_AGENT_STATE_DIR": str(tmp_path / "state")},
    )

    async def go() -> tuple[str, str]:
        async with Client(params) as client:
            rendered = await client.call_tool(
                "render_job",
                {
                    "model": "qwen2.5vl",
                    "task": "sft",
                    "out_dir": "jobs/q",
                    "mm_root": hostile,
                    "confirm": True,
                },
            )
            assert not rendered.is_error, rendered.content
            doctor = await client.call_tool("check_environment", {"python": "jobs/q/finetune.sh"})
            assert doctor.is_error
            return rendered.content[0].text, doctor.content[0].text

    _, refusal = anyio.run(go)
    assert "python" in refusal and "fix:" in refusal
    assert not canary.exists(), "the doctor executed the rendered script"

    # The script itself, run by bash the way the launcher runs it (cd into the hostile MM_ROOT works: the
    # directory exists under its literal name); `torchrun` is a stand-in that only records it ran.
    (ws / hostile).mkdir(parents=True)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "torchrun").write_text(f"#!/bin/sh\necho ran > {tmp_path / 'TORCHRUN'}\n", encoding="utf-8")
    (stubs / "torchrun").chmod(0o755)
    out = subprocess.run(
        ["bash", str(ws / "jobs" / "q" / "finetune.sh")],
        env={**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (tmp_path / "TORCHRUN").exists(), out.stderr  # the script ran through to its launcher
    assert not canary.exists(), "a rendered value was evaluated by bash"
