"""The remembered tool list (mm_agent/toollist.py): a start answers tools/list from it without loading the core,
says exactly what a full start says, still calls every tool, and never trusts a file it should not: a corrupt
one is ignored, a stale one is replaced (and logged) once the tools have loaded, a change to the code or the
options is a different key."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import ListToolsResult

from mm_agent import toollist
from mm_agent.server import build_server

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MM_AGENT_CACHE_DIR", str(folder))
    return folder


def _wire(tools: list) -> str:  # type: ignore[type-arg]
    """tools/list as it goes over the wire."""
    return ListToolsResult(tools=tools).model_dump_json(by_alias=True, exclude_none=True)


@pytest.mark.anyio
async def test_a_remembered_start_lists_what_a_full_start_lists_and_calls_tools(
    tmp_path: Path, cache: Path
) -> None:
    full = await build_server(tmp_path).list_tools()
    async with Client(build_server(tmp_path)) as client:
        full_wire = _wire((await client.list_tools()).tools)  # as a client reads it

    first = build_server(tmp_path, remember_tools=True)  # nothing remembered yet: a full start that writes it
    assert first._loaded  # type: ignore[attr-defined]
    assert _wire(await first.list_tools()) == _wire(full)
    assert [p.name for p in cache.glob("tools-*.json")], "the list was not remembered"

    second = build_server(tmp_path, remember_tools=True)
    assert not second._loaded  # type: ignore[attr-defined]  # the core is not loaded to answer tools/list
    events: list[object] = []
    second._subscriptions.subscribe(events.append)  # type: ignore[attr-defined]
    async with Client(second) as client:
        assert _wire((await client.list_tools()).tools) == full_wire
        r = await client.call_tool("route_model", {"request": "fine-tune Wan2.1 text-to-video on 8 NPUs"})
        assert not r.is_error, r.content
        assert r.structured_content["candidates"][0]["model_id"] == "wan2.1"  # type: ignore[index]
        bad = await client.call_tool("route_model", {"request": "x", "nonsense": 1})
        assert bad.is_error and "it takes: " in bad.content[0].text  # type: ignore[union-attr]
    assert second._loaded  # type: ignore[attr-defined]
    assert events == []  # the list it gave was the right one: nothing to tell


def test_a_remembered_start_imports_no_core(tmp_path: Path, cache: Path) -> None:
    """In a fresh process: tools/list from the remembered list loads none of the core; the first call does."""
    code = (
        "import sys, pathlib, anyio\n"
        "from mcp import Client\n"
        "from mm_agent.server import build_server\n"
        "CORE = ('mm_agent.mcptools', 'mm_agent.route', 'mm_agent.registry', 'yaml', 'jinja2')\n"
        "async def main():\n"
        "    s = build_server(pathlib.Path(sys.argv[1]), remember_tools=True)\n"
        "    n = len(await s.list_tools())\n"
        "    print(n, ','.join(m for m in CORE if m in sys.modules) or '-')\n"
        "    async with Client(s) as client:\n"
        "        r = await client.call_tool('list_models', {'family': 'vlm'})\n"
        "    print('qwen2.5vl' in str(r.structured_content), 'mm_agent.mcptools' in sys.modules)\n"
        "anyio.run(main)\n"
    )
    env = {**os.environ, "MM_AGENT_CACHE_DIR": str(cache)}

    def run() -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, cwd=REPO
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    count, loaded, called, _ = run()  # nothing remembered: the full start loads the core
    assert int(count) >= 16 and "mm_agent.mcptools" in loaded and called == "True"
    count, loaded, called, after = run()
    assert int(count) >= 16 and loaded == "-", f"a remembered start imported {loaded}"
    assert (called, after) == ("True", "True")  # the first call loaded the tools and answered


@pytest.mark.anyio
async def test_a_corrupt_file_is_ignored_and_rewritten(tmp_path: Path, cache: Path) -> None:
    key = toollist.fingerprint({"trusted_checkouts": False})
    cache.mkdir()
    path = cache / f"tools-{key}.json"
    for junk in ("{not json", json.dumps({"key": key, "tools": [{"name": 3}]}), json.dumps([1, 2])):
        path.write_text(junk, encoding="utf-8")
        server = build_server(tmp_path, remember_tools=True)
        assert server._loaded  # type: ignore[attr-defined]  # nothing to trust: a full start
        tools = await server.list_tools()
        saved = json.loads(path.read_text(encoding="utf-8"))
        assert saved["key"] == key and [t["name"] for t in saved["tools"]] == [t.name for t in tools]


@pytest.mark.anyio
async def test_a_stale_list_is_replaced_once_the_tools_load(
    tmp_path: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A list the key failed to tell apart (here: written by hand under the right key) is served until the tools
    have loaded, then logged, replaced on disk and no longer served."""
    right = _wire(await build_server(tmp_path, remember_tools=True).list_tools())  # writes the right list
    (path,) = cache.glob("tools-*.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    data["tools"][0]["description"] = "an old description"
    path.write_text(json.dumps(data), encoding="utf-8")

    server = build_server(tmp_path, remember_tools=True)
    events: list[object] = []
    server._subscriptions.subscribe(events.append)  # type: ignore[attr-defined]  # subscriptions/listen's bus
    assert "an old description" in _wire(await server.list_tools())  # what was remembered, as said
    with caplog.at_level(logging.WARNING, logger="mm_agent.server"):
        await server.tools_ready()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while "an old description" in path.read_text(encoding="utf-8") and time.monotonic() < deadline:
            await server.list_tools()
    assert _wire(await server.list_tools()) == right
    assert "an old description" not in path.read_text(encoding="utf-8")
    assert any("differed from the loaded tools" in r.getMessage() for r in caplog.records)
    assert [type(e).__name__ for e in events] == ["ToolsListChanged"]  # listening clients are told


def test_the_key_follows_the_code_and_the_options(tmp_path: Path) -> None:
    base = toollist.fingerprint({"trusted_checkouts": False})
    assert base == toollist.fingerprint({"trusted_checkouts": False})
    assert base != toollist.fingerprint({"trusted_checkouts": True})  # validate_configs' annotations differ

    import hashlib

    def tree() -> str:
        digest = hashlib.sha256()
        toollist._tree(digest, tmp_path)
        return digest.hexdigest()

    (tmp_path / "a.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "__pycache__").mkdir()
    before = tree()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0")  # bytecode does not count
    assert tree() == before
    (tmp_path / "a.py").write_text("x = 22\n", encoding="utf-8")  # an edited file does
    assert tree() != before


@pytest.mark.anyio
async def test_an_unwritable_cache_costs_only_speed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("MM_AGENT_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be created
    server = build_server(tmp_path, remember_tools=True)
    assert len(await server.list_tools()) >= 16
    assert len(await build_server(tmp_path, remember_tools=True).list_tools()) >= 16


@pytest.mark.anyio
async def test_stdio_starts_remember_the_list(tmp_path: Path) -> None:
    """`mm-agent serve` itself remembers: a second start over stdio lists the same tools and calls them."""
    cache = tmp_path / "cache"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mm_agent", "serve", "--workspace", str(tmp_path)],
        cwd=str(REPO),
        env={**os.environ, "MM_AGENT_CACHE_DIR": str(cache)},
    )
    lists = []
    for _ in range(2):
        async with Client(params) as client:
            lists.append(_wire((await client.list_tools()).tools))
            r = await client.call_tool("list_models", {"family": "vlm"})
            assert not r.is_error and "qwen2.5vl" in json.dumps(r.structured_content)
    assert lists[0] == lists[1]
    assert len(list(cache.glob("tools-*.json"))) == 1


@pytest.mark.anyio
async def test_a_list_others_can_write_is_not_trusted(tmp_path: Path, cache: Path) -> None:
    """What tools/list says reaches the model: a remembered list that another user could have written is not
    served (a full start instead, which writes this user's own)."""
    await build_server(tmp_path, remember_tools=True).list_tools()
    (path,) = cache.glob("tools-*.json")
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o646)
    server = build_server(tmp_path, remember_tools=True)
    assert server._loaded  # type: ignore[attr-defined]
    await server.list_tools()
    assert path.stat().st_mode & 0o777 == 0o600
    assert not build_server(tmp_path, remember_tools=True)._loaded  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_no_home_means_nothing_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user with no home to name (no $HOME, no passwd entry: some containers) still gets a server, and a
    full start each time, instead of a crash at start-up."""
    for name in ("MM_AGENT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert toollist.cache_dir() is None
    server = build_server(tmp_path, remember_tools=True)
    assert server._loaded  # type: ignore[attr-defined]
    assert len(await server.list_tools()) >= 16
