"""The skills' workflows (mm_agent/skills/workflows.yaml, which the skills render) run as tests.

Each scenario test walks the EXACT step list of its workflow against a real in-process MCP client session,
feeding each step's structured output into the next, and checks the end state. A step whose tool this file
cannot drive fails the test, and only a step with a decision point (`when`) may be skipped, each skip with
its reason in the trace, so a skill whose instructions drift from the tools fails here. Confirm steps are
always called as a dry run first; the scenario says which of them the user agrees to.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client

from mm_agent.cli import build_parser
from mm_agent.diagnose.catalog import get_catalog
from mm_agent.render import RenderRequest
from mm_agent.render import render_job as render_core
from mm_agent.runs import runs_dir
from mm_agent.server import build_server
from mm_agent.skills import Workflow, WorkflowStep, load_workflows
from mm_agent.skills.context import list_tools

DEADLINE_S = 300.0  # guard against a hung run; never reached when the code works
# The CLI subcommand that is each tool's equivalent (README: "CLI equivalents").
TOOL_CLI = {
    "check_environment": "doctor",
    "route_model": "route",
    "install_deps": "install",
    "convert_weights": "convert",
    "render_job": "render",
    "validate_configs": "validate",
    "extract_features": "extract",
    "launch_training": "train",
    "job_status": "status",
    "tail_logs": "logs",
    "stop_job": "stop",
    "diagnose_errors": "diagnose",
    "list_models": "models",
    "prepare_dataset": "dataset",
    "scaffold_model": "new-model",
}
# Root-cause categories fixed by changing the job (re-render); the others are checked on the machine.
JOB_CAUSES = {
    "config_invalid",
    "data_format",
    "checkpoint_not_found",
    "checkpoint_parallel_mismatch",
    "checkpoint_unconverted",
    "checkpoint_optimizer_state",
    "nan_loss",
}
LAYOUT_FIELDS = {"tp", "pp", "vpp", "pipeline_num_layers"}  # a fix touching these needs a re-conversion
FILLERS = {
    "request": "fine-tune Wan2.1 t2v on my videos",
    "model": "wan2.1",
    "task": "t2v",
    "size": "1.3b",
    "runtime": "bundled",
    "mm_version": "26.0.0",
    "converter": "WanConverter",
    "method": "hf_to_mm",
    "run_id": "train-20261122-101500-a1b2c3",
    "pp_layers": "7,8,8,7",
    "vit_pp_layers": "32,0",
    "family": "vlm",
    "pid": "12345",
    "name": "tinydit",
    "base": "wan2.1",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------------------------------------------------
# the workflows name real tools and real commands


@pytest.mark.anyio
async def test_every_step_names_a_tool_the_server_registers(tmp_path: Path) -> None:
    async with Client(build_server(tmp_path), raise_exceptions=True) as client:
        registered = {t.name for t in (await client.list_tools()).tools}
    workflows = load_workflows()
    used = {step.tool for w in workflows.scenarios for step in w.steps}
    assert used <= registered, f"tools the server does not have: {sorted(used - registered)}"
    assert {w.id for w in workflows.scenarios} >= {
        "finetune-generative",
        "finetune-vlm",
        "recover-failed-run",
    }


def _argv(command: str) -> list[str]:
    filled = re.sub(r"\{([a-z_]+)\}", lambda m: FILLERS.get(m.group(1), f"x/{m.group(1)}"), command)
    argv = shlex.split(filled)
    assert argv[0] == "mm-agent", command
    return argv[1:]


@pytest.mark.parametrize(
    "step",
    [pytest.param(s, id=f"{w.id}/{s.id}") for w in load_workflows().scenarios for s in w.steps],
)
def test_every_cli_equivalent_parses_as_the_tools_command(step: WorkflowStep) -> None:
    parser = build_parser()
    for command in filter(None, (step.cli, step.cli_confirm)):
        argv = _argv(command)
        assert argv[0] == TOOL_CLI[step.tool], f"{step.id}: {step.tool} is `mm-agent {TOOL_CLI[step.tool]}`"
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{step.id}: `{command}` does not parse with the real mm-agent parser")
        assert callable(args.func)
    if step.confirm:  # the confirm form is the dry run plus what makes it act
        assert step.cli_confirm is not None and step.cli_confirm != step.cli


def test_mutating_tools_are_confirm_steps() -> None:
    mutating = {t.name for t in list_tools() if t.mutating}
    assert {"install_deps", "convert_weights", "render_job", "launch_training", "stop_job"} <= mutating
    for workflow in load_workflows().scenarios:
        for step in workflow.steps:
            assert step.confirm == (step.tool in mutating), f"{workflow.id}/{step.id}"


# ---------------------------------------------------------------------------------------------------------
# the walker


@dataclass
class Walk:
    """One scenario: the client session, the user's inputs and decisions, and what the steps produced."""

    client: Client
    workflow: Workflow
    inputs: dict[str, Any]
    agree: set[str] = field(default_factory=set)  # confirm steps the user agrees to (others stay dry runs)
    state: dict[str, Any] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool -> its input properties

    async def _properties(self, tool: str) -> dict[str, Any]:
        listed = {t.name: t for t in (await self.client.list_tools()).tools}
        return dict(listed[tool].input_schema.get("properties", {}))

    async def call(self, tool: str, req: dict[str, Any]) -> dict[str, Any]:
        # the whole result (detail) where a tool shapes its answer: the walk checks what every field says
        shaped = "detail" in self.schemas.setdefault(tool, await self._properties(tool))
        result = await self.client.call_tool(tool, {**req, "detail": True} if shaped else req)
        assert not result.is_error, f"{tool}({req}): {result.content}"
        assert result.structured_content is not None
        return result.structured_content

    async def mutate(self, step: WorkflowStep, req: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Dry run first (always); the real call only when the user agrees to this step."""
        dry = await self.call(step.tool, {**req, "confirm": False})
        assert dry["status"] == "dry_run", f"{step.id}: a dry run must not act: {dry['status']}"
        if step.id not in self.agree:
            return dry, False
        return await self.call(step.tool, {**req, "confirm": True}), True

    async def run(self) -> list[str]:
        for step in self.workflow.steps:
            driver = DRIVERS.get(step.tool)
            if driver is None:
                pytest.fail(f"{self.workflow.id}/{step.id}: no driver for tool {step.tool!r}")
            outcome = await driver(self, step)
            if outcome.startswith("skip"):
                assert step.when, f"{step.id} has no decision point, so it may not be skipped ({outcome})"
            self.trace.append(f"{step.id}: {outcome}")
            print(f"{self.workflow.id} {self.trace[-1]}")  # shown when a test fails
        return self.trace


Driver = Callable[[Walk, WorkflowStep], Awaitable[str]]


async def check_environment(walk: Walk, step: WorkflowStep) -> str:
    cause = walk.state.get("root_cause")
    if cause is not None and cause["category"] in JOB_CAUSES:
        return f"skip: a {cause['category']} cause is fixed in the job, not on the machine"
    req: dict[str, Any] = {}
    if "{model}" in step.cli and "model" in walk.state:
        req["model"] = walk.state["model"]
    if "{job_dir}" in step.cli:
        req["job"] = walk.state["job_dir"]
    report = await walk.call(step.tool, req)
    assert report["checks"] and sum(report["counts"].values()) == len(report["checks"])
    walk.state["doctor"] = {c["id"]: c["status"] for c in report["checks"]}
    return f"{len(report['checks'])} checks"


async def route_model(walk: Walk, step: WorkflowStep) -> str:
    result = await walk.call(
        step.tool, {"request": walk.inputs["request"], "runtime": walk.inputs["runtime"]}
    )
    assert result["question"] is None and result["candidates"], result["question"]
    top = result["candidates"][0]
    assert top["available_in_version"], top["explanation"]
    walk.state.update(
        model=top["model_id"],
        task=top["task"],
        backend=top["backend"],
        size=top["size"],
        mm_version=top["mm_version"],
        converter=top["converter"],
        method=top["converter_method"],
        features=top["needs_feature_extraction"],
        skill=top["skill"],
    )
    weights = next(s for s in top["pipeline"] if s["stage"] == "weights")
    for name, flag in (("pp_layers", "llm_pp_layers"), ("vit_pp_layers", "vit_pp_layers")):
        m = re.search(rf"--cfg\.parallel_config\.{flag} '(\[.*?\]+)'", " ".join(weights["commands"]))
        if m:  # MindSpeed-MM's hf_to_mm spells one VPP chunk as [[...]]: its stages are the inner list
            layers = json.loads(m.group(1))
            walk.state[name] = layers[0] if len(layers) == 1 and isinstance(layers[0], list) else layers
    return f"{top['model_id']} {top['task']} {top['backend']} {top['size']}"


async def install_deps(walk: Walk, step: WorkflowStep) -> str:
    req = {"model": walk.state["model"], "mm_version": walk.state["mm_version"]}
    result, done = await walk.mutate(step, req)
    assert result["plan"]["steps"] and result["run"] is None and not done
    return f"dry run: {len(result['plan']['steps'])} planned steps"


async def convert_weights(walk: Walk, step: WorkflowStep) -> str:
    if "root_cause" in walk.state and not LAYOUT_FIELDS & set(walk.inputs["fix"]):
        return "skip: the fix leaves the checkpoint layout alone"
    if walk.state["converter"] is None:
        return "skip: the model has no converter"
    hf = walk.inputs["hf_dir"]
    req: dict[str, Any] = {
        "converter": walk.state["converter"],
        "method": walk.state["method"],
        "source": f"{hf}/transformer" if "{hf_dir}/transformer" in step.cli else hf,
        "target": walk.inputs["load_path"],
    }
    for name in ("pp_layers", "vit_pp_layers"):
        if f"{{{name}}}" in step.cli:
            req[name] = walk.state[name]
    result, done = await walk.mutate(step, req)
    assert result["plan"]["layout"], "the plan shows the files it will write"
    walk.state["run_id"] = result["run_id"] if done else None
    walk.state["converted"] = done
    return f"started {result['run_id']}" if done else f"dry run: {len(result['plan']['layout'])} rank file(s)"


async def job_status(walk: Walk, step: WorkflowStep) -> str:
    run_id = walk.state.get("run_id")
    if run_id is None:
        return "skip: no run was started (dry run, or the user brought only a log)"
    end = time.monotonic() + DEADLINE_S
    while True:
        status = await walk.call(step.tool, {"run_id": run_id, "log_lines": 5})
        if status["state"] != "running":
            break
        assert time.monotonic() < end, f"{run_id} still running after {DEADLINE_S} s"
        await anyio.sleep(0.5)
    assert status["state"] == "succeeded", (status["message"], status["root_cause"], status["log_tail"])
    walk.state["last_status"] = status
    return f"{status['kind']} {run_id} succeeded"


async def render_job(walk: Walk, step: WorkflowStep) -> str:
    if "job_dir" in walk.state:  # re-render: the job's own spec plus the fix the user agreed to
        category = walk.state["root_cause"]["category"]
        if category not in JOB_CAUSES:
            return f"skip: a {category} cause does not change the job"
        spec = yaml.safe_load((walk.inputs["root"] / walk.state["job_dir"] / "job.yaml").read_text())
        req = {**spec, **walk.inputs["fix"], "out_dir": walk.state["job_dir"], "force": True}
    else:
        s = walk.state
        req = {
            "model": s["model"],
            "task": s["task"],
            "backend": s["backend"],
            "size": s["size"],
            "runtime": walk.inputs["runtime"],
            "out_dir": walk.inputs["job_dir"],
            "weights_dir": walk.inputs["hf_dir"],
            "load_path": walk.inputs["load_path"],
            **walk.inputs["render"],
        }
    result, done = await walk.mutate(step, req)
    assert done, "the job must be written for the next steps"
    assert result["status"] in ("written", "replaced"), result["status"]
    walk.state["job_dir"] = req["out_dir"]
    return f"{result['status']} {len(result['files'])} files"


async def prepare_dataset(walk: Walk, step: WorkflowStep) -> str:
    if "job_dir" in walk.state:
        return "skip: the dataset was prepared before the first render"
    render = walk.inputs["render"]
    req: dict[str, Any] = {
        "dir": render["dataset_dir"],
        "model": walk.state["model"],
        "task": walk.state["task"],
    }
    if "{runtime}" in step.cli:
        req["runtime"] = walk.inputs["runtime"]
    if "{dataset_index}" in step.cli:
        req["index"] = walk.inputs["dataset_index"]
    for name in ("num_frames", "max_height", "max_width", "text_len"):  # what the job will be rendered with
        if name in render:
            req[name] = render[name]
    result, done = await walk.mutate(step, req)
    assert result["accepted"] > 0 and not result["rejected"], result["rejected"]
    assert done, "the index must be written for render and validate"
    assert result["written"] == str(walk.inputs["root"] / render["dataset_file"]), result["written"]
    return f"{result['status']}: {result['accepted']} item(s)"


async def validate_configs(walk: Walk, step: WorkflowStep) -> str:
    report = await walk.call(step.tool, {"paths": [walk.state["job_dir"]]})
    errors = [f"{f['rule']}: {f['message']}" for f in report["findings"] if f["severity"] == "error"]
    assert report["error_count"] == 0, errors
    walk.state["validated"] = report
    return f"0 errors, {report['warning_count']} warnings"


async def _stage(walk: Walk, step: WorkflowStep) -> str:
    if step.tool == "extract_features" and not walk.state["features"]:
        return "skip: the model needs no feature extraction"
    req: dict[str, Any] = {"job_dir": walk.state["job_dir"], **walk.inputs.get("stage", {})}
    fix_env = walk.state.get("fix_env")
    if fix_env:
        req["env"] = {**req.get("env", {}), **fix_env}
    if not walk.state.get("converted", True):  # the user did not confirm the conversion
        dry = await walk.client.call_tool(step.tool, req)
        refusal = str(dry.content[0].text) if dry.is_error else ""  # type: ignore[union-attr]
        assert "LOAD_PATH" in refusal and "mm-agent convert" in refusal, "no training from random weights"
        return "refused: no converted checkpoint yet (the fix is the convert step)"
    result, done = await walk.mutate(step, req)
    for name, value in (fix_env or {}).items():
        assert result["env"].get(name) == value, f"{name} must reach the relaunched job"
    walk.state["run_id"] = result["run_id"] if done else None
    return f"started {result['run_id']}" if done else f"dry run: {' '.join(result['argv'][:3])} ..."


async def diagnose_errors(walk: Walk, step: WorkflowStep) -> str:
    status = walk.state.get("last_status")
    if status is not None and status["state"] == "succeeded" and status["root_cause"] is None:
        return "skip: the run succeeded with no root cause"
    log = walk.inputs.get("log_path")
    if log is None:
        return "skip: no log in the workspace"
    report = await walk.call(step.tool, {"paths": [log]})
    walk.state["diagnosis"] = report
    cause = report["root_cause"]
    if cause is None:
        return f"category {report['category']}, no root cause"
    walk.state["root_cause"] = cause
    env = {}
    for fix in cause["fixes"]:  # an `export NAME=VALUE` fix is applied as the relaunch's environment
        m = re.fullmatch(r"export (HCCL_[A-Z_]+)=(\S+)", fix.get("command") or "")
        if fix["action"] == "env" and m and not env:
            env[m.group(1)] = m.group(2)
    walk.state["fix_env"] = env
    return f"root cause {cause['rule_id']} ({cause['category']})"


DRIVERS: dict[str, Driver] = {
    "check_environment": check_environment,
    "route_model": route_model,
    "install_deps": install_deps,
    "convert_weights": convert_weights,
    "job_status": job_status,
    "render_job": render_job,
    "prepare_dataset": prepare_dataset,
    "validate_configs": validate_configs,
    "extract_features": _stage,
    "launch_training": _stage,
    "diagnose_errors": diagnose_errors,
}


@pytest.fixture
def mm_checkout(ws: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a MindSpeed-MM job runs: its checkout folder and `torchrun` on PATH. MindSpeed-MM cannot run
    here, so both are stand-ins: only dry runs, which check that they exist, use them."""
    (ws / "MindSpeed-MM").mkdir()
    bin_dir = ws.parent / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(
        "#!/bin/sh\necho 'stand-in: MindSpeed-MM cannot run here' >&2\nexit 1\n"
    )
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return ws / "MindSpeed-MM"


# ---------------------------------------------------------------------------------------------------------
# (a) fine-tune Wan2.1 t2v on my videos: a started-and-finished bundled run

CLIPS, FRAMES, SIDE, ITERS = 4, 17, 64, 10
SIZE_ARGS = ("--height", str(SIDE), "--width", str(SIDE), "--seed", "0")


@pytest.fixture
def wan_inputs(ws: Path) -> Path:
    """Tiny Wan2.1 weights (diffusers layout) and a 4-clip video-caption dataset, as `mm-agent demo` makes
    them, inside the workspace (the server refuses paths, symlinks included, that leave it)."""
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    for args in (
        ["weights", str(ws / "weights"), "--seed", "0"],
        [
            "dataset",
            str(ws / "dataset"),
            "--count",
            str(CLIPS),
            "--frames",
            str(FRAMES),
            *SIZE_ARGS,
            "--sidecars",
        ],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "runtime.synth", *args], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return ws


@pytest.mark.anyio
@pytest.mark.slow
async def test_finetune_generative_wan21_t2v_trains_to_the_end(ws: Path, wan_inputs: Path) -> None:
    tok = json.loads((wan_inputs / "weights" / "tokenizer" / "tokenizer_config.json").read_text())
    workflow = load_workflows().get("finetune-generative")
    async with Client(build_server(ws), raise_exceptions=True) as client:
        walk = Walk(
            client,
            workflow,
            inputs={
                "root": ws,
                "request": workflow.example,
                "runtime": "bundled",
                "hf_dir": "weights",
                "load_path": "converted",
                "job_dir": "job",
                "render": {  # the demo's small sizes: 2 processes, 17x64x64 clips, 10 iterations
                    "dataset_dir": "dataset",
                    "dataset_file": "dataset/data.json",
                    "feature_dir": "sora_features",
                    "save_path": "checkpoints",
                    "npus_per_node": 2,
                    "nnodes": 1,
                    "tp": 1,
                    "pp": 1,
                    "cp": 1,
                    "mbs": 1,
                    "grad_acc": 1,
                    "train_iters": ITERS,
                    "save_interval": ITERS,
                    "lr": 5e-3,
                    "num_workers": 0,
                    "num_frames": FRAMES,
                    "max_height": SIDE,
                    "max_width": SIDE,
                    "text_len": int(tok["model_max_length"]),
                    "seed": 0,
                    "device": "cpu",
                    "master_port": 29000 + (time.time_ns() // 1000) % 9000,
                },
            },
            agree={"dataset", "convert", "render", "extract", "train"},
        )
        trace = await walk.run()

    assert [t.split(":")[0] for t in trace] == [s.id for s in workflow.steps]
    assert trace[2] == f"dataset: written: {CLIPS} item(s)", trace  # the index the job reads
    assert trace[3].startswith("install: dry run"), trace  # nothing installed
    assert walk.state["skill"] == workflow.skill == "mindspeed-mm-generative"
    status = walk.state["last_status"]
    assert (status["kind"], status["state"], status["iteration"], status["total"]) == (
        "train",
        "succeeded",
        ITERS,
        ITERS,
    )
    assert (ws / "checkpoints" / f"iter_{ITERS:07d}").is_dir()
    assert (ws / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)
    assert len(list((ws / "sora_features" / "features").glob("*.pt"))) == CLIPS
    assert (ws / "converted" / "latest_checkpointed_iteration.txt").read_text().strip() == "release"
    assert trace[-1] == "diagnose: skip: the run succeeded with no root cause", trace


# ---------------------------------------------------------------------------------------------------------
# (b) fine-tune Qwen2.5-VL-3B on my image-text data: a validated MindSpeed-MM job

# Qwen/Qwen2.5-VL-3B-Instruct config.json (the fields the converter and the validator read).
QWEN25VL_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
    },
}


def sparse_qwen25vl_3b(path: Path) -> None:
    """The real 3B checkpoint's names, shapes and dtypes with no data: one sparse safetensors file.

    The conversion plan reads safetensors headers only, so the layout of a 7 GB model costs a few KB of disk.
    """
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.Qwen2_5_VLConfig(**QWEN25VL_3B)
    with torch.device("meta"):
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the embeddings: not saved
            continue
        size = tensor.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.mkdir(parents=True)
    with (path / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    (path / "config.json").write_text(json.dumps(QWEN25VL_3B))
    (path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor"})
    )


def mllm_dataset(root: Path) -> None:
    """Two image-text records as users bring them (LLaVA `conversations`, no <image> token in one): the
    workflow's prepare_dataset step turns them into the model's MLLM format."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    records = []
    for i in range(2):
        Image.new("RGB", (32, 24), (40 * i, 80, 120)).save(root / "images" / f"{i}.jpg")
        records.append(
            {
                "image": f"images/{i}.jpg",
                "conversations": [
                    {"from": "human", "value": "<image>\nWhat is in the picture?" if i else "Describe it."},
                    {"from": "gpt", "value": f"A test pattern number {i}."},
                ],
            }
        )
    (root / "llava.json").write_text(json.dumps(records))


@pytest.mark.anyio
async def test_finetune_vlm_qwen25vl_3b_gives_a_validated_job(ws: Path, mm_checkout: Path) -> None:
    sparse_qwen25vl_3b(ws / "hf" / "Qwen2.5-VL-3B-Instruct")
    mllm_dataset(ws / "data")
    workflow = load_workflows().get("finetune-vlm")
    async with Client(build_server(ws), raise_exceptions=True) as client:
        walk = Walk(
            client,
            workflow,
            inputs={
                "root": ws,
                "request": workflow.example,
                "runtime": "mindspeed-mm",
                "hf_dir": "hf/Qwen2.5-VL-3B-Instruct",
                "load_path": "ckpt/mm/Qwen2.5-VL-3B-Instruct",
                "job_dir": "job",
                "dataset_index": "data/llava.json",
                "render": {"dataset_dir": "data", "dataset_file": "data/data.json", "save_path": "save"},
            },
            agree={"dataset", "render"},  # no NPU here: conversion and training stay dry runs
        )
        trace = await walk.run()

    assert [t.split(":")[0] for t in trace] == [s.id for s in workflow.steps]
    s = walk.state
    assert (s["model"], s["task"], s["size"], s["skill"]) == ("qwen2.5vl", "sft", "3b", "mindspeed-mm-vlm")
    assert (s["pp_layers"], s["vit_pp_layers"]) == ([36], [32])  # fed from the route into the plan
    assert "convert: dry run" in " ".join(trace) and "train: refused" in " ".join(trace)
    assert "status: skip" in " ".join(trace) and not runs_dir().exists()  # nothing was started
    model = json.loads((ws / "job" / "model.json").read_text())
    assert model["text_decoder"]["num_layers"] == QWEN25VL_3B["num_hidden_layers"]
    assert s["validated"]["error_count"] == 0


# ---------------------------------------------------------------------------------------------------------
# (c) my run crashed, here is the log: a root cause with its fix, applied on the relaunch


def example_line(signature_id: str) -> str:
    """A real failure line, as the diagnose catalog records it for this signature."""
    signature = next(c.sig for c in get_catalog() if c.sig.id == signature_id)
    return signature.examples.match[0]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("signature", "fix", "expected"),
    [
        pytest.param(
            "hccl_host_port_in_use",
            {},
            ["status: skip", "diagnose: root cause hccl_host_port_in_use", "check-env:", "fix-config: skip"],
            id="hccl-bind-EI0019",
        ),
        pytest.param(
            "gbs_not_divisible",
            {"gbs": 16},
            [
                "status: skip",
                "diagnose: root cause gbs_not_divisible",
                "check-env: skip",
                "fix-config: replaced",
            ],
            id="global-batch",
        ),
    ],
)
async def test_recover_failed_run_finds_the_root_cause_and_relaunches_with_the_fix(
    ws: Path, mm_checkout: Path, signature: str, fix: dict[str, Any], expected: list[str]
) -> None:
    # the crashed job, with what its run had: converted weights and extracted features
    render_core(
        RenderRequest(
            model="wan2.1", task="t2v", out_dir="job", npus_per_node=8, load_path="ckpt", confirm=True
        ),
        root=ws,
    )
    (ws / "ckpt" / "release" / "mp_rank_00").mkdir(parents=True)
    (ws / "ckpt" / "release" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"")
    (ws / "ckpt" / "latest_checkpointed_iteration.txt").write_text("release")
    (ws / "job" / "sora_features").mkdir()
    (ws / "job" / "sora_features" / "data.jsonl").write_text("")
    (ws / "logs").mkdir()
    (ws / "logs" / "rank_1.log").write_text(
        "building SoRA model ...\n"
        f"{example_line(signature)}\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: pretrain_sora.py FAILED\n"
    )
    workflow = load_workflows().get("recover-failed-run")
    async with Client(build_server(ws), raise_exceptions=True) as client:
        walk = Walk(
            client,
            workflow,
            inputs={"root": ws, "log_path": "logs/rank_1.log", "fix": fix},
            agree={"fix-config"},  # relaunching on an NPU machine is the user's call: a dry run here
            state={"job_dir": "job"},
        )
        trace = await walk.run()

    assert [t.split(":")[0] for t in trace] == [s.id for s in workflow.steps]
    for want, got in zip(expected, trace[: len(expected)], strict=True):
        assert got.startswith(want), trace
    cause = walk.state["root_cause"]
    assert cause["effect"] == "fatal" and cause["fixes"] and cause["evidence"]
    assert trace[-2].startswith("relaunch: dry run") and trace[-1].startswith("follow: skip")
    if signature == "hccl_host_port_in_use":
        assert "hccl_ports" in walk.state["doctor"]  # the environment check looked at HCCL's ports
        assert walk.state["fix_env"] == {"HCCL_IF_BASE_PORT": "60100"}  # reached the relaunch (checked)
    else:
        assert yaml.safe_load((ws / "job" / "job.yaml").read_text())["gbs"] == 16
        assert "GRAD_ACC_STEP=2" in (ws / "job" / "pretrain.sh").read_text()  # 16 = MBS 1 x 2 x DP 8
        assert list(ws.glob("job.bak-*")), "the old job is kept as a backup"
