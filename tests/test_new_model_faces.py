"""The faces of the scaffold (issue 28, item 1): the MCP tool `scaffold_model` through a real in-process client and
`mm-agent new-model NAME` through the real CLI entry, both over `mm_agent.scaffold.scaffold_model`.

Each face: a dry run writes nothing; confirm (`--yes`) writes every file and the workspace registry entry; a path
outside the workspace is refused (MCP); bad input (an unknown base, heads that do not divide the width, a name a
shipped model has) is answered with the fix and no traceback; `--json` prints the whole result. A real MindSpeed-MM
26.1.0 tree (MM_UPSTREAM) is scaffolded into through both faces, registration included.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from test_mcp_answers import ANSWER_BUDGET
from upstream_tree import mindspeed_mm_tree

from mm_agent.cli import main
from mm_agent.scaffold import ScaffoldResult
from mm_agent.server import build_server
from mm_agent.workspace import set_workspace

TINY = {"layers": 2, "heads": 2, "head_dim": 16, "ffn_dim": 64, "freq_dim": 32, "text_dim": 32}
TINY_FLAGS = [f for k, v in TINY.items() for f in (f"--{k.replace('_', '-')}", str(v))]
# bad input -> (argument, words the error must hold)
BAD = [
    ({"base": "sd3"}, "base", "unknown base"),
    ({"hidden": 100, "heads": 3}, "hidden", "not divisible by heads"),
    ({"name": "flux"}, "name", "shipped model"),
    ({"mm_version": "26.0.0"}, "mm_version", "does not ship the new-model guide"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty workspace, also the CLI's working directory. `build_server` makes its workspace the registry's
    for the whole process (`registry.set_workspace`): reset around each test, as a fresh CLI process starts."""
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    set_workspace(None)
    yield root
    set_workspace(None)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def mm_checkout(ws: Path) -> Path:
    """A writable copy of MindSpeed-MM 26.1.0's package, inside the workspace."""
    upstream = mindspeed_mm_tree("v26.1.0", "scaffold into a real MindSpeed-MM checkout")
    checkout = ws / "MindSpeed-MM"
    shutil.copytree(upstream / "mindspeed_mm", checkout / "mindspeed_mm")
    return checkout


async def call(client: Client, args: dict[str, Any]) -> tuple[str, dict[str, Any] | None, bool]:
    r = await client.call_tool("scaffold_model", args)
    return r.content[0].text, r.structured_content, r.is_error  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------------- MCP


@pytest.mark.anyio
async def test_mcp_dry_run_writes_nothing_and_confirm_writes_it_all(ws: Path) -> None:
    args = {"name": "tinydit", "out": "new_models/tinydit", **TINY}
    async with Client(build_server(ws), raise_exceptions=True) as client:
        text, dry, err = await call(client, args)
        assert not err, text
        assert tree(ws) == {}, "a dry run writes nothing"
        assert dry is not None and dry["status"] == "dry_run"
        assert text.startswith("would write") and "confirm=true writes them" in text, text
        assert "mindspeed_mm/models/predictor/dits/tinydit_dit.py" in " ".join(dry["files"])
        cost = len(text) + len(json.dumps(dry, separators=(",", ":"), ensure_ascii=False))
        assert cost <= ANSWER_BUDGET, f"the default answer is {cost} characters"

        text, done, err = await call(client, {**args, "confirm": True})
        assert not err, text
        assert done is not None and done["status"] == "written" and text.startswith("wrote"), text
        _, again, _ = await call(client, {**args, "confirm": True, "detail": True})

    overlay = ws / "new_models" / "tinydit"
    result = ScaffoldResult.model_validate(again)  # detail=true: the whole model
    assert result.status == "unchanged"
    for f in result.files:
        assert (overlay / f.path).is_file(), f.path
    assert Path(result.registry_file).is_file() and Path(result.registry_file).is_relative_to(ws)
    assert "class TinyDiT" in (overlay / "mindspeed_mm/models/predictor/dits/tinydit_dit.py").read_text()
    assert result.copy_commands and result.register_lines  # an overlay says how it goes into a checkout
    assert f"first: {result.next_steps[0]}" in text


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["out", "checkout"])
async def test_mcp_refuses_a_path_outside_the_workspace(ws: Path, tmp_path: Path, field: str) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    async with Client(build_server(ws), raise_exceptions=True) as client:
        for where in (str(outside), "../elsewhere"):
            text, _, err = await call(client, {"name": "tinydit", field: where, "confirm": True})
            assert err and "outside" in text and "fix:" in text, text
            assert "Traceback" not in text
    assert tree(outside) == {} and tree(ws) == {}


@pytest.mark.anyio
@pytest.mark.parametrize(("bad", "field", "words"), BAD, ids=[b[1] for b in BAD])
async def test_mcp_bad_input_is_answered_with_the_fix(
    ws: Path, bad: dict[str, Any], field: str, words: str
) -> None:
    async with Client(build_server(ws), raise_exceptions=True) as client:
        text, _, err = await call(client, {"name": "tinydit", **bad, "confirm": True})
    assert err and words in text and f"{field}: " in text, text
    assert "fix:" in text and "Traceback" not in text, text
    assert tree(ws) == {}


@pytest.mark.anyio
async def test_mcp_writes_into_a_real_checkout_and_registers_the_dit(ws: Path) -> None:
    checkout = mm_checkout(ws)
    registration = checkout / "mindspeed_mm/models/predictor/predict_model.py"
    before = registration.read_text()
    async with Client(build_server(ws), raise_exceptions=True) as client:
        _, dry, _ = await call(client, {"name": "tinydit", "checkout": "MindSpeed-MM", **TINY})
        assert registration.read_text() == before, "a dry run edits nothing"
        text, done, err = await call(
            client, {"name": "tinydit", "checkout": "MindSpeed-MM", **TINY, "confirm": True}
        )
    assert not err and done is not None and done["mode"] == "checkout", text
    assert "edit mindspeed_mm/models/predictor/predict_model.py" in dry["files"]  # type: ignore[index]
    after = registration.read_text()
    assert "from .dits.tinydit_dit import TinyDiT" in after and '"tinydit": TinyDiT' in after
    assert (checkout / "examples/tinydit/model.json").is_file() and (
        checkout / "pretrain_tinydit.py"
    ).is_file()


# ------------------------------------------------------------------------------------------------------- CLI


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["new-model", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_dry_run_writes_nothing_and_yes_writes(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "tinydit", "--from", "wan2.1", "--out", "overlay", *TINY_FLAGS)
    assert code == 0, err
    assert tree(ws) == {}
    assert "would write" in out and "nothing written yet" in out and "--yes" in out, out
    assert "mindspeed_mm/models/predictor/dits/tinydit_dit.py" in out and "next:" in out

    code, out, err = cli(
        capsys, "tinydit", "--from", "wan2.1", "--out", "overlay", *TINY_FLAGS, "--yes", "--json"
    )
    assert code == 0, err
    result = ScaffoldResult.model_validate(json.loads(out))  # the whole model, as the tool's detail=true
    assert result.status == "written" and result.arch["num_layers"] == TINY["layers"]
    for f in result.files:
        assert (ws / "overlay" / f.path).is_file(), f.path
    assert (ws / ".mm-agent" / "models" / "tinydit.yaml").is_file()


@pytest.mark.parametrize(("bad", "field", "words"), BAD, ids=[b[1] for b in BAD])
def test_cli_bad_input_exits_2_with_the_fix(
    ws: Path, capsys: pytest.CaptureFixture[str], bad: dict[str, Any], field: str, words: str
) -> None:
    name = bad.get("name", "tinydit")
    flags = [
        f
        for k, v in bad.items()
        if k != "name"
        for f in ("--from" if k == "base" else "--" + k.replace("_", "-"), str(v))
    ]
    code, out, err = cli(capsys, name, *flags, "--yes")
    assert code == 2 and err.startswith(f"error: {field}: ") and words in err and "\nfix: " in err, err
    assert "Traceback" not in err + out
    assert tree(ws) == {}


def test_cli_writes_into_a_real_checkout(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkout = mm_checkout(ws)
    code, out, err = cli(capsys, "tinydit", "--checkout", str(checkout), *TINY_FLAGS, "--yes")
    assert code == 0, err
    assert "wrote" in out and "edit" in out and "predict_model.py" in out, out
    assert '"tinydit": TinyDiT' in (checkout / "mindspeed_mm/models/predictor/predict_model.py").read_text()
    assert os.path.isfile(checkout / "mindspeed_mm/models/predictor/dits/tinydit_dit.py")


# ---------------------------------------------------------------------------------------------------- prompt


@pytest.mark.anyio
async def test_the_new_model_prompt_gives_the_workflow_with_the_routed_base(ws: Path, tmp_path: Path) -> None:
    from mcp.shared.exceptions import MCPError

    from mm_agent.skills.workflows import load_workflows

    (ws / "MindSpeed-MM").mkdir()
    request = "bring my own DiT, starting from Wan2.2 5B"
    async with Client(build_server(ws), raise_exceptions=True) as client:
        got = await client.get_prompt(
            "new_model", {"request": request, "name": "tinydit", "checkout": "MindSpeed-MM"}
        )
        overlay = await client.get_prompt("new_model", {"request": "自定义模型", "name": "tinydit"})
        refused = {}
        for bad in ({"checkout": str(tmp_path)}, {"base": "sd3"}):
            with pytest.raises(MCPError) as exc:
                await client.get_prompt("new_model", {"request": request, "name": "tinydit", **bad})
            refused[next(iter(bad))] = str(exc.value)
    text = got.messages[0].content.text  # type: ignore[union-attr]
    steps = load_workflows().get("new-model").steps
    positions = [text.index(f"{i}. `{s.tool}`") for i, s in enumerate(steps, start=1)]
    assert positions == sorted(positions) and steps[1].tool == "scaffold_model"
    assert "`mm-agent new-model tinydit --from wan2.2-5b --checkout MindSpeed-MM --yes`" in text, text
    assert "`mm-agent demo --new-model`" in text
    assert "out=new_models/tinydit" in overlay.messages[0].content.text  # type: ignore[union-attr]
    assert "outside" in refused["checkout"] and "unknown base 'sd3'" in refused["base"], refused


# ------------------------------------------------------------------------------------------ the workflow


@pytest.mark.anyio
async def test_the_new_model_workflow_walks_over_mcp(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The skills' `new-model` workflow, step by step as the data gives it, against a real MindSpeed-MM 26.1.0
    checkout: routed, scaffolded and registered (dry run first), rendered as a job from the workspace's registry
    entry, validated clean against the checkout, and the training's dry run. torchrun is a stand-in on PATH
    (MindSpeed-MM cannot run here; only the dry run, which checks that it exists, uses it)."""
    from mm_agent.skills.workflows import load_workflows

    checkout = mm_checkout(ws)
    bin_dir = ws.parent / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    registration = checkout / "mindspeed_mm/models/predictor/predict_model.py"
    workflow = load_workflows().get("new-model")
    state: dict[str, Any] = {}
    trace: list[str] = []
    async with Client(build_server(ws), raise_exceptions=True) as client:

        async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
            r = await client.call_tool(tool, args)
            assert not r.is_error and r.structured_content is not None, (tool, r.content)
            return r.structured_content

        async def mutate(tool: str, args: dict[str, Any]) -> dict[str, Any]:
            before = registration.read_text()
            dry = await call(tool, {**args, "confirm": False})
            assert dry["status"] == "dry_run" and registration.read_text() == before, tool
            return await call(tool, {**args, "confirm": True})

        for step in workflow.steps:
            assert step.confirm == (step.tool in {"scaffold_model", "render_job", "launch_training"}), step.id
            if step.tool == "route_model":
                routed = await call(step.tool, {"request": workflow.example})
                state["base"] = routed["new_model"]["base"]
                trace.append(f"{step.id}: {routed['new_model']['tool']} from {state['base']}")
            elif step.tool == "scaffold_model":
                done = await mutate(
                    step.tool, {"name": "tinydit", "base": state["base"], "checkout": "MindSpeed-MM", **TINY}
                )
                assert done["status"] == "written" and '"tinydit": TinyDiT' in registration.read_text()
                trace.append(f"{step.id}: {done['status']}")
            elif step.tool == "render_job":
                done = await mutate(
                    step.tool,
                    {"model": "tinydit", "task": "t2v", "out_dir": "job", "mm_root": "MindSpeed-MM"},
                )
                trace.append(f"{step.id}: {done['status']}")
            elif step.tool == "validate_configs":
                report = await call(step.tool, {"paths": ["job"], "detail": True})
                errors = [
                    f"{f['rule']}: {f['message']}" for f in report["findings"] if f["severity"] == "error"
                ]
                assert report["error_count"] == 0, errors
                trace.append(f"{step.id}: 0 errors")
            elif step.tool == "launch_training":  # the user's NPU machine's call: a dry run here
                dry = await call(step.tool, {"job_dir": "job"})
                assert dry["status"] == "dry_run" and dry["argv"][-1].endswith("job/pretrain.sh"), dry
                assert (
                    "torchrun $DISTRIBUTED_ARGS pretrain_tinydit.py"
                    in (ws / "job" / "pretrain.sh").read_text()
                )
                trace.append(f"{step.id}: dry run")
            else:
                pytest.fail(f"new-model/{step.id}: no driver for {step.tool}")
    assert trace == [
        "route: scaffold_model from wan2.1",
        "scaffold: written",
        "render: written",
        "validate: 0 errors",
        "train: dry run",
    ], trace
