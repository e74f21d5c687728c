"""`mm-agent diagnose` as a subprocess (files, stdin, exit codes, human output) and `diagnose_errors` over a
real in-process MCP client (paths in the workspace, raw text, refusal of paths outside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from mm_agent.server import build_server

REPO = Path(__file__).resolve().parent.parent
BUS = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."
EXITED = "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly"
HEALTHY = (
    " [2026-01-01 12:00:00] iteration        7/    5000 | consumed samples:           56 | elapsed time per iteration"
    " (ms): 12500.0 | learning rate: 1.000000E-05 | global batch size:     8 | loss: 4.024374E-01 | loss scale: 1.0 |"
    " number of skipped iterations:   0 | number of nan iterations:   0 |\n"
)


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mm_agent", "diagnose", *args]
    return subprocess.run(cmd, cwd=REPO, input=stdin, capture_output=True, text=True, timeout=120)


def test_stdin_json_and_exit_codes(tmp_path: Path) -> None:
    failed = cli("-", "--json", stdin=f"{HEALTHY}[rank2]: {BUS}\n[rank2]: {EXITED}\n")
    assert failed.returncode == 1, failed.stderr
    report = json.loads(failed.stdout)
    assert report["category"] == "shm_bus_error" and report["files"] == ["<stdin>"]
    root = report["root_cause"]
    assert set(root) >= {"category", "rule_id", "title", "ranks", "evidence", "cause", "fixes"}
    assert root["ranks"] == [2] and root["evidence"][0] == {
        "file": "<stdin>",
        "line": 2,
        "text": f"[rank2]: {BUS}",
    }
    healthy = cli("-", "--json", stdin=HEALTHY)
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["root_cause"] is None
    missing = cli(str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "nope.log: no such file or directory" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_human_output(tmp_path: Path) -> None:
    log = tmp_path / "rank_5.log"
    log.write_text(HEALTHY + BUS + "\n" + EXITED + "\n")
    out = cli(str(log))
    assert out.returncode == 1, out.stderr
    text = out.stdout
    assert "ROOT CAUSE" in text and "shm_bus_error" in text and "rank 5" in text
    assert f"{log}:2" in text and "cause:" in text
    assert "  1. [" in text and "$ docker run --ipc=host" in text
    assert "other findings" in text and "dataloader_worker_exited" in text
    assert "progress: iteration 7/5000, loss 0.4024 (unknown), 12.50 s/step" in text
    mixed = cli(str(log), "-", "--json", stdin="")  # a file and an empty stdin
    assert mixed.returncode == 1 and json.loads(mixed.stdout)["files"] == [str(log), "<stdin>"]
    healthy = tmp_path / "ok.log"
    healthy.write_text(HEALTHY)
    ok = cli(str(healthy))
    assert ok.returncode == 0 and "no failure found" in ok.stdout


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_paths_text_and_confinement(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "logs/plog").mkdir(parents=True)
    (ws / "logs/rank_1.log").write_text(HEALTHY + EXITED + "\n")
    (ws / "logs/plog/plog-1_2026.log").write_text(f"[2025-12-31 23:59:59] [rank1]: {BUS}\n")
    (tmp_path / "secret.log").write_text(BUS + "\n")
    async with Client(build_server(ws), raise_exceptions=True) as client:
        r = await client.call_tool("diagnose_errors", {"paths": ["logs"]})
        assert not r.is_error
        report = r.structured_content
        assert report["category"] == "shm_bus_error"  # type: ignore[index]
        # brief evidence: "file:line: text"
        assert report["root_cause"]["evidence"][0].startswith("logs/plog/plog-1_2026.log:1: ")  # type: ignore[index]
        assert report["files"] == ["logs/rank_1.log", "logs/plog/plog-1_2026.log"]  # type: ignore[index]

        big = HEALTHY * 20000 + EXITED + "\n"
        r = await client.call_tool("diagnose_errors", {"text": big})
        report = r.structured_content
        assert report["root_cause"]["rule_id"] == "dataloader_worker_exited"  # type: ignore[index]
        assert ":20001: " in report["root_cause"]["evidence"][0]  # type: ignore[index]

        for bad in ("../secret.log", str(tmp_path / "secret.log"), "-"):
            r = await client.call_tool("diagnose_errors", {"paths": [bad]})
            assert r.is_error, bad
        text = r.content[0].text  # type: ignore[union-attr]
        assert "-: no such file or directory" in text  # stdin is CLI-only
        r = await client.call_tool("diagnose_errors", {"paths": ["../secret.log"]})
        assert "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
        r = await client.call_tool("diagnose_errors", {})
        assert r.is_error and "nothing to diagnose" in r.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_diagnose_a_run_by_id_over_mcp_and_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's log lives in mm-agent's state dir, outside the workspace: the run id makes it readable."""
    from mm_agent.runs import RunStatusRequest, start_run, wait_run

    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    line = (
        "[PID: 2267203] 2025-11-21-11:38:29.575.404 Communication_Error_Bind_IP_Port(EI0019): Failed to enable "
        "listening for the host network adapter socket.Reason: The IP address 192.168.1.100 and port 50001 "
        "have already been bound."
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # a run of this workspace's server (a server answers only for its own: tests/security/test_run_scope.py)
    info = start_run(
        "test", [sys.executable, "-c", f"print({line!r})"], RunStatusRequest(run_id="x"), workspace=workspace
    )
    wait_run(info.run_id, lambda status: None)
    async with Client(build_server(workspace), raise_exceptions=True) as client:
        r = await client.call_tool("diagnose_errors", {"run_id": info.run_id})
        assert r.structured_content is not None
        assert r.structured_content["root_cause"]["rule_id"] == "hccl_host_port_in_use"
        unknown = await client.call_tool("diagnose_errors", {"run_id": "train-nope"})
        assert unknown.is_error and "no run 'train-nope'" in unknown.content[0].text  # type: ignore[union-attr]
    done = subprocess.run(
        [sys.executable, "-m", "mm_agent", "diagnose", "--run", info.run_id, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "MM_AGENT_STATE_DIR": str(tmp_path / "state")},
    )
    assert (
        done.returncode == 1 and json.loads(done.stdout)["root_cause"]["rule_id"] == "hccl_host_port_in_use"
    )
