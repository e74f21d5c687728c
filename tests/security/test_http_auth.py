"""`mm-agent serve --transport http` requires a bearer token when one is configured (issue 25, low hole).

Hole guarded here: the streamable HTTP transport had no authentication: any local user or process could call
every tool (write files, start runs) as the server's user. Now `--auth-token-file FILE` (or
`$MM_AGENT_HTTP_TOKEN`) makes the SDK's own bearer check answer 401 to requests without the token or with
another; loopback-only stays the default, and without a token the server still serves loopback but logs a
warning. Real server subprocesses on a free loopback port, the SDK's streamable-HTTP client.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from security.serverproc import START_GUARD_S, Served, free_port, serve_http

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    started: list[Served] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Served:
        started.append(serve_http(tmp_path, *args, env=env))
        return started[-1]

    yield start
    for served in started:
        served.stop()


def _token_file(tmp_path: Path, mode: int = 0o600) -> tuple[Path, str]:
    token = secrets.token_urlsafe(32)
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path, token


def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    return httpx2.post(url, content=json.dumps(INITIALIZE), headers={**HEADERS, **headers}, timeout=30)


async def _initialize(url: str, token: str) -> str:
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    async with client, Client(streamable_http_client(url, http_client=client), mode="legacy") as session:
        assert (await session.list_tools()).tools  # a call after the handshake works too
        return session.server_info.name if session.server_info else ""


def test_without_the_token_or_with_another_the_answer_is_401(serve: object, tmp_path: Path) -> None:
    path, token = _token_file(tmp_path)
    server = serve("--auth-token-file", str(path))  # type: ignore[operator]
    assert _post(server.url, {}).status_code == 401
    assert _post(server.url, {"Authorization": "Bearer " + secrets.token_urlsafe(32)}).status_code == 401
    assert _post(server.url, {"Authorization": token}).status_code == 401  # no "Bearer " scheme
    assert _post(server.url, {"Authorization": f"Bearer {token}"}).status_code == 200
    assert anyio.run(_initialize, server.url, token) == "mm-agent"


def test_the_token_may_come_from_the_environment(serve: object) -> None:
    token = secrets.token_urlsafe(32)
    server = serve(env={"MM_AGENT_HTTP_TOKEN": token})  # type: ignore[operator]
    assert _post(server.url, {}).status_code == 401
    assert anyio.run(_initialize, server.url, token) == "mm-agent"


def test_without_a_token_loopback_still_serves_and_warns(serve: object) -> None:
    server = serve()  # type: ignore[operator]
    assert _post(server.url, {}).status_code == 200
    end = time.monotonic() + START_GUARD_S
    while "HTTP without authentication" not in server.log.read_text():
        assert time.monotonic() < end, server.log.read_text()
        time.sleep(0.1)


@pytest.mark.parametrize("problem", ["readable by others", "too short", "two words"])
def test_a_bad_token_file_is_refused_at_start(tmp_path: Path, problem: str) -> None:
    path, _ = _token_file(tmp_path, 0o644 if problem == "readable by others" else 0o600)
    if problem == "too short":
        path.write_text("abc\n")
    elif problem == "two words":
        path.write_text("abc def ghi jkl mno pqr\n")
    done = subprocess.run(
        [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(tmp_path), "--transport", "http",
         "--port", str(free_port()), "--auth-token-file", str(path)],
        capture_output=True, text=True, timeout=START_GUARD_S, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--auth-token-file" in done.stderr and "fix:" in done.stderr, done.stderr
