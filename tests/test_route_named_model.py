"""Requests that name a model, answered over a real in-process MCP client.

Why: three answers sent a user the wrong way. "CogVideoX 5b" read as "no size 5b, using 1.0" (its size ids are
versions, 1.0 and 1.5, both 5B: the registry's `params` says so); "InternVL3 ... on my images" was classed
"generative" (the word "images" is an image-generation family word, but the named model decides the family);
InternVL3's inference stage said "No inference script" although every release that trains it ships
examples/internvl3/inference_internvl.sh (the registry now names its entry, inference_vlm.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcpcall import call_tool


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_parameter_count_names_a_size_whose_id_is_a_version(tmp_path: Path) -> None:
    text, data, _ = await call_tool(tmp_path, "route_model", request="fine-tune CogVideoX 5b text to video")
    best = data["candidates"][0]
    assert (best["model_id"], best["task"], best["size"]) == ("cogvideox", "t2v", "1.0")
    assert "no size 5b" not in text
    assert "size 5b is CogVideoX 1.0 (also 1.5: name it to choose)" in text
    # one size of that count: taken as asked, nothing to say
    text, data, _ = await call_tool(tmp_path, "route_model", request="fine-tune Janus-Pro 7B")
    assert data["candidates"][0]["model_id"] == "januspro" and "no size" not in text


@pytest.mark.anyio
async def test_render_job_reads_a_parameter_count_or_asks_which_version(tmp_path: Path) -> None:
    text, _, error = await call_tool(
        tmp_path, "render_job", model="cogvideox", task="t2v", size="5b", out_dir="j"
    )
    assert error and "1.0 or 1.5" in text, text
    text, data, error = await call_tool(
        tmp_path, "render_job", model="januspro", task="sft", size="7b", out_dir="j"
    )
    assert not error and data["size"] == "default", text


@pytest.mark.anyio
async def test_a_named_vlm_on_images_is_not_classed_generative(tmp_path: Path) -> None:
    _, data, _ = await call_tool(tmp_path, "route_model", request="fine-tune InternVL3 8B on my images")
    assert "generative" not in data["parsed"].get("families", [])
    best = data["candidates"][0]
    assert (best["model_id"], best["task"], best["size"]) == ("internvl3", "sft", "8b")


@pytest.mark.anyio
@pytest.mark.parametrize("version", ["2.2.0", "2.3.0", "26.0.0"])
async def test_internvl3_has_an_inference_stage_at_every_version_that_trains_it(
    tmp_path: Path, version: str
) -> None:
    _, data, _ = await call_tool(
        tmp_path, "route_model", request="fine-tune InternVL3 8B", mm_version=version
    )
    best = data["candidates"][0]
    assert best["model_id"] == "internvl3"
    inference = next(s for s in best["pipeline"] if s["stage"] == "inference")
    assert inference["applies"] is True, inference
    assert "No inference" not in inference["summary"]
