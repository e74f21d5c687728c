"""Real requests answered right (issue 29, item 1 part A), each through the core function and an in-process MCP
client: the Chinese and English "LoRA of Wan2.1 14B image-to-video on 2 x 8" request is the i2v LoRA job (the
stock examples/wan2.1/14b/i2v/finetune_lora.sh), whose render downloads the I2V weights; a dry run's
`key_values` are the training script's own; `prepare_dataset`'s suggested command reproduces the call (a real
`mm-agent dataset` subprocess accepts the same clips), and its default answer fits the budget."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from mm_agent.dataset import DatasetRequest, prepare_dataset
from mm_agent.render import RenderRequest, render_job
from mm_agent.route import RouteRequest, route_model
from mm_agent.server import build_server
from runtime.synth import write_mp4

ANSWER_BUDGET = 4_000  # characters of a default answer: text + structured content as compact JSON
I2V_LORA_REQUESTS = [
    "我想在两台机器每台8卡910B上用LoRA微调Wan2.1 14B 图生视频",
    "LoRA fine-tune Wan2.1 14B image-to-video on two machines with 8 Ascend 910B NPUs each",
]
I2V_14B = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
T2V_14B = "Wan-AI/Wan2.1-T2V-14B-Diffusers"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") or "" for c in result.content)


def _cost(result: Any) -> int:
    data = result.structured_content
    return len(_text(result)) + (
        len(json.dumps(data, separators=(",", ":"), ensure_ascii=False)) if data else 0
    )


# ---- route_model: the i2v LoRA -----------------------------------------------------------------------
@pytest.mark.parametrize("request_text", I2V_LORA_REQUESTS)
def test_route_i2v_lora_request_is_the_14b_i2v_lora_job(request_text: str) -> None:
    best = route_model(RouteRequest(request=request_text)).candidates[0]
    assert (best.model_id, best.task, best.adapts, best.size) == ("wan2.1", "lora", "i2v", "14b")
    assert (best.npus_per_node, best.nnodes) == (8, 2)
    assert "examples/wan2.1/14b/i2v/finetune_lora.sh" in best.explanation
    stages = {s.stage: s for s in best.pipeline}
    assert any(I2V_14B in c for c in stages["weights"].commands), stages["weights"].commands
    assert not any(T2V_14B in c for c in stages["weights"].commands)
    assert stages["training"].commands == ["bash examples/wan2.1/14b/i2v/finetune_lora.sh"]


def test_route_t2v_lora_request_stays_the_t2v_lora() -> None:
    best = route_model(RouteRequest(request="LoRA fine-tune Wan2.1 14B text-to-video")).candidates[0]
    assert (best.model_id, best.task, best.adapts, best.size) == ("wan2.1", "lora", "t2v", "14b")
    training = next(s for s in best.pipeline if s.stage == "training")
    assert training.commands == ["bash examples/wan2.1/14b/t2v/finetune_lora.sh"]


@pytest.mark.anyio
@pytest.mark.parametrize("request_text", I2V_LORA_REQUESTS)
async def test_mcp_route_default_answer_names_the_i2v_lora_and_its_render_call(
    tmp_path: Path, request_text: str
) -> None:
    async with Client(build_server(tmp_path)) as client:
        result = await client.call_tool("route_model", {"request": request_text})
    assert not result.is_error
    text = _text(result)
    best = text.splitlines()[0]
    assert best.startswith("Best: wan2.1 lora of the i2v model"), text
    assert "examples/wan2.1/14b/i2v/finetune_lora.sh" in text
    assert "render_job" in text and "adapts=i2v" in text  # what the next call needs, in the text itself
    top = result.structured_content["candidates"][0]  # type: ignore[index]
    assert (top["task"], top["adapts"], top["size"], top["nnodes"]) == ("lora", "i2v", "14b", 2)
    assert _cost(result) <= ANSWER_BUDGET


# ---- render_job: the adapted task's weights; key_values from the training script -------------------------
def _render(tmp_path: Path, **fields: Any) -> dict[str, str]:
    result = render_job(RenderRequest(model="wan2.1", out_dir=str(tmp_path / "job"), **fields), root=tmp_path)
    return {f.path: f.content or "" for f in result.files} | {"<next>": "\n".join(result.next_steps)}


def test_render_i2v_lora_downloads_i2v_weights_and_configures_the_i2v_model(tmp_path: Path) -> None:
    files = _render(tmp_path, task="lora", size="14b", adapts="i2v")
    assert f"huggingface-cli download {I2V_14B}" in files["<next>"] and T2V_14B not in files["<next>"]
    model = json.loads(files["pretrain_model.json"])
    assert model["task"] == "i2v" and model["predictor"]["in_dim"] == 36
    assert "--lora-r 16" in files["pretrain.sh"]
    assert f"LOAD_PATH={tmp_path}/weights/{I2V_14B}/transformer" in files["pretrain.sh"]
    # the i2v DiT trains on i2v features (first-frame latents): extraction runs the i2v model config
    assert "feature_extract/model_i2v.json" in files and "feature_extract/model_t2v.json" not in files
    assert "feature_extract/model_i2v.json" in files["feature_extract/feature_extraction.sh"]


def test_render_default_lora_is_the_stock_t2v_lora(tmp_path: Path) -> None:
    files = _render(tmp_path, task="lora", size="14b")
    assert f"huggingface-cli download {T2V_14B}" in files["<next>"] and I2V_14B not in files["<next>"]
    assert json.loads(files["pretrain_model.json"])["task"] == "t2v"


def test_render_refuses_an_adapted_task_the_stock_examples_lack(tmp_path: Path) -> None:
    from mm_agent.errors import MMAgentError

    with pytest.raises(MMAgentError) as err:  # 1.3B ships a t2v LoRA only
        _render(tmp_path, task="lora", size="1.3b", adapts="i2v")
    assert err.value.field == "adapts" and "14b" in (err.value.fix or "")
    with pytest.raises(MMAgentError) as err:
        _render(tmp_path, task="t2v", adapts="i2v")
    assert err.value.field == "adapts"


@pytest.mark.anyio
async def test_mcp_render_key_values_are_the_training_scripts(tmp_path: Path) -> None:
    async with Client(build_server(tmp_path)) as client:
        args = {"model": "wan2.1", "task": "lora", "size": "14b", "adapts": "i2v", "out_dir": "jobs/l"}
        result = await client.call_tool("render_job", args)
        full = await client.call_tool("render_job", {**args, "detail": True})
    assert not result.is_error, _text(result)
    values = result.structured_content["key_values"]  # type: ignore[index]
    files = {f["path"]: f["content"] for f in full.structured_content["files"]}  # type: ignore[index]
    # every value is the one pretrain.sh sets (not inference.sh's merged LOAD_PATH, not extraction's MBS)
    for name, value in values.items():
        assert f"\n{name}={value}\n" in files["pretrain.sh"], name
    assert values["LOAD_PATH"].endswith(f"{I2V_14B}/transformer")
    assert "transformer_merge" in files["inference.sh"]
    assert "wan2.1 lora of the i2v model" in _text(result)
    assert I2V_14B in _text(result)  # the first next step, the download, is in the text


# ---- prepare_dataset: the suggested command is the call, and it fits the budget ---------------------------
CLIPS = 16


def _clips(folder: Path, count: int, frames: int = 17) -> None:
    folder.mkdir(parents=True)
    ramp = np.arange(416, dtype=np.uint8)[None, None, :]
    for i in range(count):
        video = np.zeros((frames, 240, 416, 3), np.uint8)
        video[..., 0] = 12 * i
        video[..., 1] = ramp
        write_mp4(folder / f"clip_{i:02}.mp4", video, 16)
        (folder / f"clip_{i:02}.txt").write_text(
            f"a red ramp, clip number {i}, sliding left", encoding="utf-8"
        )


def _small_job(ws: Path, out: str) -> None:
    """Wan 2.1 t2v at 17 frames of 240x416 on one NPU: the stock 81-frame job would reject these clips."""
    request = RenderRequest(
        model="wan2.1", task="t2v", out_dir=out, num_frames=17, max_height=240, max_width=416, npus_per_node=1
    )
    render_job(request.model_copy(update={"confirm": True}), root=ws)


@pytest.mark.anyio
async def test_mcp_prepare_dataset_suggests_the_same_call_and_it_accepts_the_same_clips(ws: Path) -> None:
    _small_job(ws, "jobs/x")
    _clips(ws / "clips", CLIPS)
    (ws / "clips" / "broken.mp4").write_bytes(b"not a video")
    (ws / "clips" / "broken.txt").write_text("a clip that does not decode", encoding="utf-8")
    async with Client(build_server(ws)) as client:
        dry = await client.call_tool(
            "prepare_dataset", {"dir": "clips", "model": "wan2.1", "job_dir": "jobs/x"}
        )
    assert not dry.is_error, _text(dry)
    text, data = _text(dry), dry.structured_content
    assert data is not None and data["accepted"] == CLIPS
    assert _cost(dry) <= ANSWER_BUDGET, _cost(dry)
    suggested = data["next_steps"][0]
    assert suggested in text  # a text-only host sees the command
    argv = shlex.split(suggested)
    assert argv[:2] == ["mm-agent", "dataset"] and argv[-1] == "--yes"
    assert argv[argv.index("--job") + 1] == str(ws / "jobs/x")
    # the suggested command, run as it is (with --json), accepts the same clips and writes their index
    env = {**os.environ, "MM_AGENT_STATE_DIR": os.environ["MM_AGENT_STATE_DIR"]}
    run = [sys.executable, "-m", "mm_agent", *argv[1:], "--json", "--workers", "1"]
    done = subprocess.run(run, cwd="/", env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["accepted"] == CLIPS and out["written"] == data["index"]
    assert sorted(r["path"] for r in out["rejected"]) == sorted(r["path"] for r in data["rejected"])


@pytest.mark.anyio
async def test_mcp_prepare_dataset_all_rejected_fits_the_budget_and_says_the_fix(ws: Path) -> None:
    """16 clips against the stock 8-NPU job: one sample size of 16 < 32 clips, all rejected for one reason
    (5,566 characters before: ten copies of the same reason and fix)."""
    render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="jobs/stock", confirm=True), root=ws)
    _clips(ws / "clips", CLIPS)
    async with Client(build_server(ws)) as client:
        dry = await client.call_tool(
            "prepare_dataset", {"dir": "clips", "model": "wan2.1", "job_dir": "jobs/stock"}
        )
    text, data = _text(dry), dry.structured_content
    assert data is not None and data["accepted"] == 0 and data["stats"]["reasons"] == {"small_group": CLIPS}
    assert _cost(dry) <= ANSWER_BUDGET, _cost(dry)
    assert "would write" not in text and "nothing written" in text
    first, *rest = data["rejected"]
    assert first["fix"] in text  # the next step (the fix) is in the text a text-only host reads
    assert rest and all(r == {"path": r["path"], "same_as": first["path"]} for r in rest)


def test_confirm_with_nothing_accepted_does_not_say_would_write(ws: Path) -> None:
    from mm_agent.answers import answer

    _small_job(ws, "jobs/x")
    _clips(ws / "long", 2)
    for caption in (ws / "long").glob("*.txt"):
        caption.unlink()  # a clip without a caption is rejected (no_caption)
    (ws / "long" / "empty.mp4").write_bytes(b"")
    result = prepare_dataset(
        DatasetRequest(dir="long", model="wan2.1", job_dir="jobs/x", confirm=True), root=ws, workers=1
    )
    assert result.accepted == 0 and result.written is None
    text, _ = answer(result, False)
    assert "would write" not in text and "nothing written" in text, text
    assert not (ws / "long" / "data.json").exists()
