"""The MCP face through real clients: in-process (both protocol eras), a stdio subprocess, and the
MCP Inspector CLI as an outside client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from mm_agent.server import build_server

TOOLS = {
    "list_models",
    "route_model",
    "render_job",
    "validate_configs",
    "diagnose_errors",
    "check_environment",
    "stop_process",
    "install_deps",
    "convert_weights",
    "extract_features",
    "launch_training",
    "job_status",
    "tail_logs",
    "stop_job",
}
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_tools_listed_with_schemas_and_annotations(workspace: Path, mode: str) -> None:
    async with Client(build_server(workspace), mode=mode, raise_exceptions=True) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        ann = tool.annotations
        assert ann is not None
        assert None not in (
            ann.read_only_hint,
            ann.destructive_hint,
            ann.idempotent_hint,
            ann.open_world_hint,
        ), tool.name
        assert ann.open_world_hint is (tool.name == "install_deps"), tool.name  # only it downloads
        assert tool.output_schema is not None, f"{tool.name} has no output schema"
    assert tools["render_job"].annotations.read_only_hint is False  # type: ignore[union-attr]
    assert tools["validate_configs"].annotations.read_only_hint is True  # type: ignore[union-attr]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_route_render_validate_flow(workspace: Path, mode: str) -> None:
    async with Client(build_server(workspace), mode=mode, raise_exceptions=True) as client:
        routed = await client.call_tool(
            "route_model", {"req": {"text": "fine-tune Wan2.1 text-to-video on 8 NPUs"}}
        )
        assert not routed.is_error
        top = routed.structured_content["candidates"][0]  # type: ignore[index]
        assert (top["model_id"], top["task"], top["backend"]) == ("wan2.1", "t2v", "megatron")

        req = {"model": top["model_id"], "task": top["task"], "out_dir": "jobs/wan21"}
        dry = await client.call_tool("render_job", {"req": req})
        assert not dry.is_error and dry.structured_content["status"] == "dry_run"  # type: ignore[index]
        assert not (workspace / "jobs").exists(), "a dry run must not write anything"
        files = {f["path"]: f for f in dry.structured_content["files"]}  # type: ignore[index]
        assert "pretrain.sh" in files and files["pretrain.sh"]["content"].startswith("#!/bin/bash")

        written = await client.call_tool("render_job", {"req": {**req, "confirm": True}})
        assert written.structured_content["status"] == "written"  # type: ignore[index]
        assert (workspace / "jobs/wan21/pretrain.sh").is_file()

        report = await client.call_tool("validate_configs", {"req": {"paths": ["jobs/wan21"]}})
        assert not report.is_error
        assert report.structured_content["ok"] is True, report.structured_content  # type: ignore[index]

        models = await client.call_tool("list_models", {"req": {"family": "vlm"}})
        ids = {m["id"] for m in models.structured_content["models"]}  # type: ignore[index]
        assert "qwen2.5vl" in ids and "wan2.1" not in ids


@pytest.mark.anyio
async def test_paths_confined_to_workspace(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "escape").symlink_to(outside)
    async with Client(build_server(workspace)) as client:
        for out_dir in ("../evil", "/etc/mm-agent-job", "escape/job"):
            r = await client.call_tool(
                "render_job", {"req": {"model": "wan2.1", "task": "t2v", "out_dir": out_dir, "confirm": True}}
            )
            assert r.is_error, out_dir
            assert "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
        r = await client.call_tool("validate_configs", {"req": {"paths": ["/etc"]}})
        assert r.is_error and "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
    assert not any(outside.iterdir())


@pytest.mark.anyio
async def test_bad_input_is_a_useful_tool_error(workspace: Path) -> None:
    async with Client(build_server(workspace)) as client:
        r = await client.call_tool("render_job", {"req": {"model": "wan2.3", "task": "t2v", "out_dir": "j"}})
        assert r.is_error
        text = r.content[0].text  # type: ignore[union-attr]
        assert "unknown model 'wan2.3'" in text and "fix:" in text and "wan2.1" in text
        r = await client.call_tool("render_job", {"req": {"model": "wan2.1", "task": "sft", "out_dir": "j"}})
        assert r.is_error and "has no task 'sft'" in r.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_stdio_subprocess(workspace: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mm_agent", "serve", "--workspace", str(workspace)], cwd=str(REPO)
    )
    async with Client(params) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        r = await client.call_tool("route_model", {"req": {"text": "把Qwen2.5-VL做多模态理解微调"}})
        assert not r.is_error
        top = r.structured_content["candidates"][0]  # type: ignore[index]
        assert (top["model_id"], top["task"]) == ("qwen2.5vl", "sft")


def test_server_start_imports_no_heavy_frameworks() -> None:
    code = (
        "import sys, mm_agent.server, mm_agent.cli\n"
        "from mm_agent.server import build_server\n"
        "import pathlib; build_server(pathlib.Path('.'))\n"
        "heavy = [m for m in ('torch', 'diffusers', 'transformers', 'megatron') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "", f"server start imported {out.stdout.strip()}"


INSPECTOR = "@modelcontextprotocol/inspector@0.15.0"


def _inspector(workspace: Path, *method_args: str) -> subprocess.CompletedProcess[str]:
    npx = shutil.which("npx")
    if npx is None:
        if os.environ.get("MM_AGENT_REQUIRE_INSPECTOR"):
            pytest.fail("npx not found but MM_AGENT_REQUIRE_INSPECTOR is set")
        pytest.skip("npx not available")
    server = [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(workspace)]
    cmd = [npx, "-y", INSPECTOR, "--cli", *server, "--", *method_args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.slow
def test_inspector_cli_lists_and_calls(workspace: Path) -> None:
    listed = _inspector(workspace, "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert names == TOOLS

    called = _inspector(
        workspace,
        "--method",
        "tools/call",
        "--tool-name",
        "route_model",
        "--tool-arg",
        'req={"text": "fine-tune Wan2.1 text-to-video on 8 NPUs"}',
    )
    assert called.returncode == 0, called.stderr
    payload = json.loads(called.stdout)
    assert payload["structuredContent"]["candidates"][0]["model_id"] == "wan2.1"
