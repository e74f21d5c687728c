"""The MCP face through real clients: in-process (both protocol eras), a stdio subprocess, and the
MCP Inspector CLI as an outside client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mm_agent.server import build_server

TOOLS = {
    "list_models",
    "route_model",
    "estimate_resources",
    "render_job",
    "validate_configs",
    "diagnose_errors",
    "check_environment",
    "prepare_dataset",
    "install_deps",
    "convert_weights",
    "extract_features",
    "launch_training",
    "job_status",
    "tail_logs",
    "stop_job",
    "scaffold_model",
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


# MCP's defaults for hints a tool leaves out (the server sends only the ones that differ)
HINT_DEFAULTS = {
    "read_only_hint": False,
    "destructive_hint": True,
    "idempotent_hint": False,
    "open_world_hint": True,
}
# characters of compact JSON every client reads before the first call (the crash workflow stays >= 5x);
# 16,350 + 1,400 for scaffold_model (issue 28, measured: 17,739 with it, 16,322 without)
# + 90 for render_job's `adapts` (issue 29: which model a LoRA adapts; measured 17,823 with it, 17,735 without)
TOOLS_LIST_BUDGET = 17_840


def _hints(tool: Any) -> dict[str, bool]:
    ann = tool.annotations
    assert ann is not None, tool.name
    return {k: getattr(ann, k) if getattr(ann, k) is not None else v for k, v in HINT_DEFAULTS.items()}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_tools_listed_flat_small_and_annotated(workspace: Path, mode: str) -> None:
    async with Client(build_server(workspace), mode=mode, raise_exceptions=True) as client:
        listed = (await client.list_tools()).tools
    tools = {t.name: t for t in listed}
    assert set(tools) == TOOLS
    for tool in tools.values():
        hints = _hints(tool)
        assert hints["open_world_hint"] is (tool.name == "install_deps"), tool.name  # only it downloads
        assert tool.output_schema is None, f"{tool.name}: answers are shaped (answers.py), no output schema"
        props = tool.input_schema["properties"]
        assert "req" not in props and props, f"{tool.name} takes flat arguments"
        assert not any("title" in v for v in props.values()), tool.name
    assert _hints(tools["render_job"])["read_only_hint"] is False
    assert _hints(tools["validate_configs"])["read_only_hint"] is True
    assert _hints(tools["stop_job"])["destructive_hint"] is True
    size = len(
        json.dumps(
            [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed],
            separators=(",", ":"),
        )
    )
    assert size <= TOOLS_LIST_BUDGET, f"tools/list is {size} characters (budget {TOOLS_LIST_BUDGET})"


@pytest.mark.anyio
async def test_unknown_and_old_style_arguments_are_refused_with_the_names(workspace: Path) -> None:
    """A misspelt or nested (`req`) argument must not be dropped silently: the error names what the tool takes."""
    async with Client(build_server(workspace)) as client:
        for args in ({"text": "wan"}, {"req": {"request": "wan"}}):
            r = await client.call_tool("route_model", args)
            assert r.is_error
            text = r.content[0].text  # type: ignore[union-attr]
            assert "route_model has no argument" in text and "request" in text and "npus_per_node" in text


@pytest.mark.anyio
async def test_stop_job_takes_a_run_or_a_pid_never_both(workspace: Path) -> None:
    """One stop tool, as `mm-agent stop RUN_ID|PID`: exactly one target, and a PID only of mm-agent's own."""
    async with Client(build_server(workspace)) as client:
        for args in ({}, {"run_id": "train-1", "pid": 1}):
            r = await client.call_tool("stop_job", args)
            assert r.is_error and "exactly one of run_id" in r.content[0].text, args  # type: ignore[union-attr]
        r = await client.call_tool("stop_job", {"pid": 1, "confirm": True})
        assert r.is_error and "not started by mm-agent" in r.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_route_render_validate_flow(workspace: Path, mode: str) -> None:
    async with Client(build_server(workspace), mode=mode, raise_exceptions=True) as client:
        routed = await client.call_tool(
            "route_model", {"request": "fine-tune Wan2.1 text-to-video on 8 NPUs"}
        )
        assert not routed.is_error
        top = routed.structured_content["candidates"][0]  # type: ignore[index]
        assert (top["model_id"], top["task"], top["backend"]) == ("wan2.1", "t2v", "megatron")

        req = {"model": top["model_id"], "task": top["task"], "out_dir": "jobs/wan21"}
        dry = await client.call_tool("render_job", req)
        assert not dry.is_error and dry.structured_content["status"] == "dry_run"  # type: ignore[index]
        assert not (workspace / "jobs").exists(), "a dry run must not write anything"
        brief = dry.structured_content
        assert "pretrain.sh" in brief["files"]  # type: ignore[index]  (names only without detail)
        assert brief["key_values"]["NPUS_PER_NODE"] == "8", brief  # type: ignore[index]
        assert "confirm=true" in dry.content[0].text  # type: ignore[union-attr]
        full = await client.call_tool("render_job", {**req, "detail": True})
        files = {f["path"]: f for f in full.structured_content["files"]}  # type: ignore[index]
        assert files["pretrain.sh"]["content"].startswith("#!/bin/bash")

        written = await client.call_tool("render_job", {**req, "confirm": True})
        assert written.structured_content["status"] == "written"  # type: ignore[index]
        assert (workspace / "jobs/wan21/pretrain.sh").is_file()

        report = await client.call_tool("validate_configs", {"paths": ["jobs/wan21"]})
        assert not report.is_error
        assert report.structured_content["ok"] is True, report.structured_content  # type: ignore[index]

        models = await client.call_tool("list_models", {"family": "vlm", "detail": True})
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
                "render_job", {"model": "wan2.1", "task": "t2v", "out_dir": out_dir, "confirm": True}
            )
            assert r.is_error, out_dir
            assert "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
        r = await client.call_tool("validate_configs", {"paths": ["/etc"]})
        assert r.is_error and "outside the workspace" in r.content[0].text  # type: ignore[union-attr]
    assert not any(outside.iterdir())


@pytest.mark.anyio
async def test_bad_input_is_a_useful_tool_error(workspace: Path) -> None:
    async with Client(build_server(workspace)) as client:
        r = await client.call_tool("render_job", {"model": "wan2.3", "task": "t2v", "out_dir": "j"})
        assert r.is_error
        text = r.content[0].text  # type: ignore[union-attr]
        assert "unknown model 'wan2.3'" in text and "fix:" in text and "wan2.1" in text
        r = await client.call_tool("render_job", {"model": "wan2.1", "task": "sft", "out_dir": "j"})
        assert r.is_error and "has no task 'sft'" in r.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_stdio_subprocess(workspace: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mm_agent", "serve", "--workspace", str(workspace)], cwd=str(REPO)
    )
    async with Client(params) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        r = await client.call_tool("route_model", {"request": "把Qwen2.5-VL做多模态理解微调"})
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


# One Inspector CLI call per tool, with flat `--tool-arg name=value` arguments as its users type them. A call
# may end in a tool error (no such run, nothing to stop): what matters is that the arguments reached the tool.
INSPECTOR_CALLS: dict[str, tuple[list[str], str]] = {
    "list_models": (["family=vlm"], "qwen2.5vl"),
    "route_model": (["request=fine-tune Wan2.1 on 2 nodes with 8 NPUs each"], "wan2.1"),
    "estimate_resources": (["model=wan2.1", "size=14b"], "32,760 tokens/sample"),
    "render_job": (["model=wan2.1", "task=t2v", "out_dir=jobs/w"], "would write"),
    "validate_configs": (['paths=["jobs"]'], "error(s)"),
    "diagnose_errors": (["text=RuntimeError: Bus error (core dumped)"], "Root cause"),
    "check_environment": (['checks=["shm"]'], "ok"),
    "prepare_dataset": (["dir=.", "model=wan2.1"], "rejected"),
    "install_deps": (["model=wan2.1"], "install steps for wan2.1"),
    "convert_weights": (["converter=WanConverter", "method=hf_to_mm", "source=w", "target=w-mm"], "source"),
    "extract_features": (["job_dir=jobs/none"], "job directory not found"),
    "launch_training": (["job_dir=jobs/none"], "job directory not found"),
    "job_status": (["run_id=no-such-run"], "no-such-run"),
    "tail_logs": (["run_id=no-such-run", "lines=5"], "no-such-run"),
    "stop_job": (["run_id=no-such-run"], "no-such-run"),
    "stop_job pid": (["pid=1"], "PID 1"),
    "scaffold_model": (["name=tinydit", "layers=2", "patch=[1,2,2]"], "would write 9 files for tinydit"),
}


@pytest.mark.slow
def test_inspector_cli_calls_every_tool_with_flat_arguments(workspace: Path) -> None:
    assert {label.split()[0] for label in INSPECTOR_CALLS} == TOOLS  # "stop_job pid": a second call
    listed = _inspector(workspace, "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr
    assert {t["name"] for t in json.loads(listed.stdout)["tools"]} == TOOLS

    def call(label: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        args = [a for arg in INSPECTOR_CALLS[label][0] for a in ("--tool-arg", arg)]
        tool = label.split()[0]
        return label, _inspector(workspace, "--method", "tools/call", "--tool-name", tool, *args)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(pool.map(call, sorted(INSPECTOR_CALLS)))
    for name, done in results.items():
        assert done.returncode in (0, 5), f"{name}: {done.stderr}"  # 5 = the tool returned isError
        payload = json.loads(done.stdout)
        text = payload["content"][0]["text"]
        assert "has no argument" not in text and "validation error" not in text, f"{name}: {text}"
        assert INSPECTOR_CALLS[name][1] in text + json.dumps(payload.get("structuredContent")), (
            f"{name}: {text}"
        )
    routed = json.loads(results["route_model"].stdout)["structuredContent"]["candidates"][0]
    assert (routed["model_id"], routed["npus_per_node"], routed["nnodes"]) == ("wan2.1", 8, 2)
