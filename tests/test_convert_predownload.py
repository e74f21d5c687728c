"""`convert_weights` before the weights are downloaded: a dry run plans from the registry and names the
download first; a confirmed run is refused with the download as its fix.

Why: an assistant plans the pipeline before anything is fetched, and the dry run used to fail with
"Directory not found". Called over a real in-process MCP client; the planned command is checked against the
one `render_job` prints for the same job (the two must agree: the user runs one of them), and the planned
Wan layout against MindSpeed-MM's stock PP split of Wan2.1-1.3B.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from mcpcall import call_tool

WAN = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
QWEN = "Qwen/Qwen2.5-VL-3B-Instruct"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_wan_dry_run_plans_from_the_registry_and_names_the_download(tmp_path: Path) -> None:
    source = f"weights/{WAN}/transformer"
    text, data, error = await call_tool(
        tmp_path, "convert_weights", converter="WanConverter", method="hf_to_mm", source=source,
        target=source, pp_layers=[7, 8, 8, 7], detail=True,
    )  # fmt: skip
    assert not error, text
    assert data["status"] == "dry_run"
    download = f"huggingface-cli download {WAN} --local-dir {tmp_path / 'weights' / WAN}"
    assert download in text  # the text alone says what comes first
    plan = data["plan"]
    assert plan["download"] == download and plan["estimate"] is None
    assert [f["path"] for f in plan["layout"]] == [
        f"release/mp_rank_00_00{i}/model_optim_rng.pt" for i in range(4)
    ]
    assert [f["layers"] for f in plan["layout"]][-1] == [list(range(23, 30))]  # 30 layers: the registry's
    assert not (tmp_path / "weights").exists()  # a dry run writes nothing


@pytest.mark.anyio
async def test_a_split_that_cannot_add_up_is_refused_before_the_download(tmp_path: Path) -> None:
    source = f"weights/{WAN}/transformer"
    text, _, error = await call_tool(
        tmp_path, "convert_weights", converter="WanConverter", method="hf_to_mm", source=source,
        target=source, pp_layers=[7, 8, 8],
    )  # fmt: skip
    assert error and "30" in text, text


@pytest.mark.anyio
async def test_vlm_plan_is_the_command_render_job_prints(tmp_path: Path) -> None:
    _, rendered, _ = await call_tool(
        tmp_path, "render_job", model="qwen2.5vl", task="sft", size="3b", out_dir="jobs/q", detail=True
    )
    step = next(s for s in rendered["next_steps"] if "Qwen2_5_VLConverter hf_to_mm" in s)
    source = str(tmp_path / "weights" / QWEN)
    text, data, error = await call_tool(
        tmp_path, "convert_weights", converter="Qwen2_5_VLConverter", method="hf_to_mm", source=source,
        target=f"{source}-mm", detail=True,
    )  # fmt: skip
    assert not error, text
    assert step.endswith(shlex.join(data["plan"]["mm_convert_argv"])), (step, data["plan"]["mm_convert_argv"])
    assert f"huggingface-cli download {QWEN} --local-dir {source}" in text


@pytest.mark.anyio
async def test_confirmed_conversion_without_weights_says_download_first(tmp_path: Path) -> None:
    source = f"weights/{WAN}/transformer"
    text, _, error = await call_tool(
        tmp_path, "convert_weights", converter="WanConverter", method="hf_to_mm", source=source,
        target=source, confirm=True,
    )  # fmt: skip
    assert error and "not downloaded" in text and f"huggingface-cli download {WAN}" in text, text
    assert "Directory not found" not in text
