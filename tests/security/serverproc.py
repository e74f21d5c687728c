"""A real `mm-agent serve` for the tests: over stdio for what outlives a call (issue 25: JSON-RPC lines in,
replies collected by id on a reader thread, the processes it leaves inspected with psutil), and over
streamable HTTP on a free loopback port (`serve_http`: the bearer-token and conformance-suite tests)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from security.common import REPO, handshake

START_GUARD_S = 60  # an HTTP server listens within seconds; this only keeps a broken start from hanging
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    """A `mm-agent serve --transport http` process, its port, log and MCP endpoint."""

    def __init__(self, proc: subprocess.Popen[str], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}/mcp"

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; killed if it has not ended within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_http(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Served:
    """`mm-agent serve --transport http` in the workspace `tmp_path/ws` with its own state dir, returned once
    it listens (a server that exits or does not listen fails the test with its log). No
    `$MM_AGENT_HTTP_TOKEN` is inherited: `env` sets one where a test wants it."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if k != "MM_AGENT_HTTP_TOKEN"}
    full.update(env or {}, MM_AGENT_STATE_DIR=str(tmp_path / "state"))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(ws), "--transport", "http",
             "--port", str(port), *args],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=full, cwd=REPO,
        )  # fmt: skip
    served = Served(proc, port, log)
    end = time.monotonic() + START_GUARD_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited {proc.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return served
        except OSError:
            if time.monotonic() > end:
                served.stop()
                pytest.fail(f"the server did not listen within {START_GUARD_S} s: {log.read_text()}")
            time.sleep(0.1)
