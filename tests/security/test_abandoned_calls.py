"""Abandoned calls stop their work, and count against the limit until they have (issue 25, medium).

With `--tool-timeout 5`, 12 concurrent `prepare_dataset` calls on a 65k-clip folder were all answered
"abandoned", and 400 s later 16 pool workers and 2.5 GB were still growing: the guard freed the call's slot
at the timeout and the thread went on to the end. Now each call carries a cancellation token: the answer
says the work was cancelled, the scan stops at its next step and the pool's workers are killed; and until a
call's thread has really ended it keeps one of the server's work slots, so a flood cannot pile up work.

The folder here is sparse 256 MiB "clips" (no disk used; hashing each costs about a second), one folder per
call so no call reuses another's probe cache: each call would keep its workers busy for minutes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client

from mm_agent import mcptools
from mm_agent.server import build_server
from security.serverproc import HANG_GUARD_S, Stdio, eventually

CALLS = 12
CLIPS = 48  # per call's folder
CLIP_BYTES = 256 << 20
TOOL_TIMEOUT_S = 5  # the setting


def _dataset(ws: Path) -> list[str]:
    folders = []
    for n in range(CALLS):
        folder = ws / f"clips{n:02d}"
        folder.mkdir(parents=True)
        for i in range(CLIPS):
            with open(folder / f"c{i:03d}.mp4", "wb") as fh:
                fh.truncate(CLIP_BYTES)  # sparse: hashing reads 256 MiB of zeros
            (folder / f"c{i:03d}.txt").write_text("a cat walks along a wall", encoding="utf-8")
        folders.append(folder.name)
    return folders


def _pool_workers(server: Stdio) -> list[psutil.Process]:
    """The server's child processes but multiprocessing's resource tracker (started with the first pool,
    it serves the server for its lifetime)."""
    found = []
    for child in server.ps.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
    return found


def test_abandoned_prepare_dataset_calls_stop_their_pools(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    folders = _dataset(ws)
    server = Stdio(ws, tmp_path / "state", "--tool-timeout", str(TOOL_TIMEOUT_S))
    try:
        baseline = server.ps.num_threads()
        workers: list[int] = []  # the most pool workers seen while the calls ran
        answered = threading.Event()

        def sample() -> None:
            while not answered.is_set():
                workers.append(len(_pool_workers(server)))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for n, folder in enumerate(folders):
            server.call(f"p{n}", "prepare_dataset", {"dir": folder, "model": "wan2.1", "task": "t2v"})
        texts = []
        for n in range(CALLS):
            result = server.reply(f"p{n}")["result"]
            assert result.get("isError") is True, result
            texts.append(result["content"][0]["text"])
        answered.set()
        sampler.join()
        assert all(f"did not finish within {TOOL_TIMEOUT_S} s" in t for t in texts), texts
        assert any("abandoned; its work was cancelled" in t for t in texts), texts
        assert max(workers) > 0, "the calls never started their pools: nothing was tested"
        eventually(lambda: not _pool_workers(server), "pool workers of abandoned calls are still running")
        # the call threads end after 30 s without work; the pools' own threads ended with their pools
        eventually(
            lambda: server.ps.num_threads() <= baseline + 1,
            f"the server still runs more threads than the {baseline} it started with",
        )
        server.call("after", "list_models", {})
        assert "result" in server.reply("after")
    finally:
        server.stop()


def test_abandoned_work_counts_against_the_limit_until_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that does not stop when cancelled (stuck where no check reaches) keeps its slot: after two waves
    of 8 such calls (8 calls run at once, 8 more slots for abandoned work) a new call waits and is answered
    with an error naming the slots; once the stuck work ends, calls run again."""
    release = threading.Event()

    def stuck(req: Any) -> Any:
        release.wait(HANG_GUARD_S)
        raise AssertionError("released")

    monkeypatch.setattr(mcptools, "route_model", stuck)

    async def go() -> tuple[list[Any], Any, Any]:
        results: list[Any] = []
        async with Client(build_server(tmp_path, tool_timeout_s=1.0)) as client:

            async def blocked() -> None:
                results.append(await client.call_tool("route_model", {"request": "x"}))

            with anyio.fail_after(HANG_GUARD_S):
                for _ in range(2):  # each wave starts at once (8 run at a time) and is abandoned at 1 s
                    async with anyio.create_task_group() as tg:
                        for _ in range(8):
                            tg.start_soon(blocked)
                refused = await client.call_tool("list_models", {})
                release.set()
                await anyio.sleep(0.5)  # the stuck threads end and give their slots back
                after = await client.call_tool("list_models", {})
        return results, refused, after

    try:
        results, refused, after = anyio.run(go)
    finally:
        release.set()
    assert len(results) == 16
    for r in results:
        assert r.is_error and "abandoned; its work was cancelled" in r.content[0].text
    assert refused.is_error, "a 17th call ran while 16 abandoned calls were still working"
    text = refused.content[0].text
    assert "did not finish within 1 s" in text and "waited the whole time" in text and "fix:" in text
    assert not after.is_error, after.content[0].text
