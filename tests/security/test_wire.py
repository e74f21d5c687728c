"""The server itself under hostile traffic (issue 12, items 4 and 6): requests nested past the JSON
parser's limit and broken lines get JSON-RPC errors instead of silence; blocking work runs off the event
loop with a time limit, so stuck calls cannot take the server's threads away; FIFOs are refused before
anything opens them. Real stdio subprocesses, an in-process client and the Inspector CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from test_mcp import _inspector

from mm_agent import mcptools
from mm_agent.server import build_server
from mm_agent.wire import top_level_id
from security.common import handshake

HANG_GUARD_S = 120


def _stdio(ws: Path, tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "MM_AGENT_STATE_DIR": str(tmp_path / "state")}
    return subprocess.Popen(
        [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(ws)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _exchange(proc: subprocess.Popen[str], lines: list[str], expect: set[Any]) -> list[dict[str, Any]]:
    """Send the lines, read replies until every id in `expect` was answered, then close stdin."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n".join(lines) + "\n")
    proc.stdin.flush()
    replies: list[dict[str, Any]] = []
    timer = threading.Timer(HANG_GUARD_S, proc.kill)  # a hang guard: a missing reply fails, not hangs
    timer.start()
    try:
        while expect - {r.get("id") for r in replies}:
            line = proc.stdout.readline()
            assert line, (
                f"the server closed its output; unanswered: {expect - {r.get('id') for r in replies}}"
            )
            replies.append(json.loads(line))
    finally:
        timer.cancel()
        proc.stdin.close()
        proc.wait(timeout=HANG_GUARD_S)
    return replies


def _deep_call(rid: Any, depth: int) -> str:
    nested = '{"x": ' * depth + '"leaf"' + "}" * depth
    head = '{"jsonrpc": "2.0", "id": ' + json.dumps(rid) + ', "method": "tools/call", '
    return (
        head + '"params": {"name": "route_model", "arguments": {"request": "wan", "deep": ' + nested + "}}}"
    )


@pytest.mark.parametrize("depth", [200, 250, 5000])
def test_deep_nesting_is_answered_with_a_jsonrpc_error(tmp_path: Path, depth: int) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    route = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "after",
            "method": "tools/call",
            "params": {"name": "route_model", "arguments": {"request": "wan2.1 t2v"}},
        }
    )
    replies = {
        r.get("id"): r
        for r in _exchange(
            _stdio(ws, tmp_path),
            [*handshake("t"), _deep_call(f"deep-{depth}", depth), route],
            {0, f"deep-{depth}", "after"},
        )
    }
    deep = replies[f"deep-{depth}"]
    assert deep["error"]["code"] == -32700
    assert "nested more than 200 levels" in deep["error"]["message"]
    assert "result" in replies["after"]  # the server is still answering


def test_broken_lines_get_parse_errors_with_their_id(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    broken = [
        '{"jsonrpc": "2.0", "id": 41, "method": ',
        '{"jsonrpc": "2.0", "id": "s", "method": 5}',
        "not json",
    ]
    tail = json.dumps({"jsonrpc": "2.0", "id": "end", "method": "tools/list"})
    replies = _exchange(_stdio(ws, tmp_path), [*handshake("t"), *broken, tail], {0, 41, "s", None, "end"})
    errors = [r for r in replies if "error" in r]
    assert [(e["id"], e["error"]["code"]) for e in errors] == [(41, -32700), ("s", -32600), (None, -32700)]


def test_top_level_id_ignores_nested_ids_and_is_linear() -> None:
    assert top_level_id('{"params": {"id": 5}, "id": 6}') == 6
    assert top_level_id('{"a": "\\"id\\": 3", "id": "x"}') == "x"
    assert top_level_id('{"id": true}') is None
    assert top_level_id("[" * 100_000) is None


def test_blocked_calls_time_out_and_others_are_still_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten calls that block (more than the server's worker threads) each get an error at the time limit,
    and a call made while they are stuck is answered."""
    release = threading.Event()

    def stuck(req: Any) -> Any:
        release.wait(HANG_GUARD_S)
        raise AssertionError("released")

    monkeypatch.setattr(mcptools, "route_model", stuck)

    async def go() -> tuple[list[Any], Any]:
        results: list[Any] = []
        async with Client(build_server(tmp_path, tool_timeout_s=1.0)) as client:

            async def blocked() -> None:
                results.append(await client.call_tool("route_model", {"request": "x"}))

            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(blocked)
                await anyio.sleep(0.2)
                listed = await client.call_tool("list_models", {})
        return results, listed

    try:
        results, listed = anyio.run(go)
    finally:
        release.set()
    assert not listed.is_error
    assert len(results) == 10
    for r in results:
        assert r.is_error and "did not finish within 1 s" in r.content[0].text and "fix:" in r.content[0].text


def test_forty_fifo_reads_do_not_exhaust_the_server(tmp_path: Path) -> None:
    """diagnose_errors on a FIFO blocked forever, and 40 such calls took every worker thread."""
    os.mkfifo(tmp_path / "pipe")

    async def go() -> tuple[list[Any], Any]:
        results: list[Any] = []
        async with Client(build_server(tmp_path, tool_timeout_s=60)) as client:

            async def one() -> None:
                results.append(await client.call_tool("diagnose_errors", {"paths": ["pipe"]}))

            with anyio.fail_after(HANG_GUARD_S):
                async with anyio.create_task_group() as tg:
                    for _ in range(40):
                        tg.start_soon(one)
                after = await client.call_tool("diagnose_errors", {"text": "iteration 1/2 | lm loss: 1.0"})
        return results, after

    results, after = anyio.run(go)
    assert len(results) == 40
    for r in results:
        assert r.is_error and "FIFO" in r.content[0].text and "fix:" in r.content[0].text
    assert not after.is_error


@pytest.mark.slow
def test_inspector_cli_refuses_the_workspace_as_out_dir(tmp_path: Path) -> None:
    """`render_job(out_dir=".", force, confirm)` moved the whole workspace to a backup outside it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "mine.txt").write_text("keep\n", encoding="utf-8")
    args = ["model=wan2.1", "task=t2v", "out_dir=.", "confirm=true", "force=true"]
    flat = [a for arg in args for a in ("--tool-arg", arg)]
    called = _inspector(ws, "--method", "tools/call", "--tool-name", "render_job", *flat)
    assert called.returncode in (0, 5), called.stderr  # 5 = "the tool returned isError" in newer Inspectors
    result = json.loads(called.stdout)
    assert result["isError"] is True
    assert "out_dir" in result["content"][0]["text"] and "fix:" in result["content"][0]["text"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]
    assert (ws / "mine.txt").read_text(encoding="utf-8") == "keep\n"
