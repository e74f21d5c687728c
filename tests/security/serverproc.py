"""A real `mm-agent serve` over stdio for the tests of what outlives a call (issue 25): JSON-RPC lines in,
replies collected by id on a reader thread, and the processes it leaves inspected with psutil."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from security.common import REPO, handshake

HANG_GUARD_S = 120  # never reached when the server works; a missing reply fails the test instead of the suite


class Stdio:
    def __init__(self, ws: Path, state: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(ws), *args],
            cwd=REPO,
            env={**(env or os.environ), "MM_AGENT_STATE_DIR": str(state)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.ps = psutil.Process(self.proc.pid)
        self._replies: dict[Any, dict[str, Any]] = {}
        self._arrived: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        for line in handshake("issue25"):
            self.send_line(line)
        self.reply(0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "id" in msg:
                self._replies[msg["id"]] = msg
                self._arrived.put(msg["id"])

    def send_line(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def call(self, rid: Any, tool: str, arguments: dict[str, Any]) -> None:
        params = {"name": tool, "arguments": arguments}
        self.send_line(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}))

    def cancel(self, rid: Any) -> None:
        params = {"requestId": rid, "reason": "the user pressed stop"}
        self.send_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}))

    def reply(self, rid: Any) -> dict[str, Any]:
        deadline = time.monotonic() + HANG_GUARD_S
        while rid not in self._replies:
            try:
                self._arrived.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no reply to request {rid!r}") from None
        return self._replies[rid]

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def stop(self) -> None:
        """Kill the server and everything still in its process group (a failing test leaks nothing)."""
        if self.proc.poll() is None:
            kids = self.ps.children(recursive=True)
            self.proc.kill()
            for kid in kids:
                kill(kid.pid)
        self.proc.wait(HANG_GUARD_S)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not ours counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill(pid: int) -> None:
    with contextlib.suppress(psutil.Error):
        psutil.Process(pid).kill()


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def eventually(condition: Callable[[], bool], what: str, limit_s: float = HANG_GUARD_S) -> None:
    """Wait until `condition()` holds; a hang guard (the bound is far above what a working server needs),
    not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {limit_s:g} s: {what}")
        time.sleep(0.2)
