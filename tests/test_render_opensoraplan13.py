"""Open-Sora-Plan 1.3 t2v jobs (megatron_generative plus the model's own templates/models/opensoraplan1.3/).

The job is self-contained: every config a script passes is a job file, every path in them is the user's
weights folder or the job's own, and no stock placeholder (`./weights/...`) is left. Extraction and training
read one model config (as the stock extract_feature.sh does), and the DiT has one shape from training to
sampling, so the trained checkpoint loads into the sampler. Needs no MindSpeed-MM checkout (the stock diff is
tests/fidelity/test_stock_generative.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_script

MODEL = "opensoraplan1.3"
SCRIPTS = ("pretrain.sh", "feature_extract/feature_extraction.sh", "inference.sh")
# the DiT keys that decide the checkpoint's tensor shapes
SHAPE_KEYS = (
    "model_id",
    "num_layers",
    "num_heads",
    "head_dim",
    "in_channels",
    "out_channels",
    "cross_attention_dim",
    "caption_channels",
    "patch_size_thw",
    "attention_q_bias",
    "attention_k_bias",
    "attention_v_bias",
    "norm_elementwise_affine",
    "sparse1d",
    "sparse_n",
)


def _render(tmp_path: Path, **options: Any) -> tuple[Any, dict[str, str]]:
    request = RenderRequest(model=MODEL, task="t2v", out_dir=str(tmp_path / "job"), **options)
    result = render_job(request)
    return result, {f.path: f.content or "" for f in result.files}


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}.{i}")
    elif isinstance(value, str):
        yield key, value


def test_every_config_is_a_job_file_with_the_user_s_paths(tmp_path: Path) -> None:
    result, files = _render(tmp_path)
    job_dir = result.job_dir
    assert {"pretrain_model.json", "inference_model.json", "samples_prompts.txt", "inference.sh"} <= set(
        files
    )
    assert "feature_extract/model_t2v.json" not in files  # extraction reads pretrain_model.json
    for rel in SCRIPTS:
        info = parse_script(f"{job_dir}/{rel}", files[rel])
        (launch,) = info.commands
        for flag in ("--mm-data", "--mm-model", "--mm-tool"):
            value = launch.value(flag)
            if value is None:
                continue
            assert value.startswith(job_dir + "/"), f"{rel} {flag} {value} is not a job file"
            assert value[len(job_dir) + 1 :] in files, f"{rel} {flag} names {value}, which the job lacks"
    weights = json.loads(files["pretrain_model.json"])["ae"]["from_pretrained"].rsplit("/vae/", 1)[0]
    assert weights.endswith("/weights/LanguageBind/Open-Sora-Plan-v1.3.0"), weights
    for rel, text in files.items():
        assert "./weights" not in text and "your_" not in text, f"{rel} keeps a stock placeholder path"
        if not rel.endswith(".json"):
            continue
        for key, value in _strings(json.loads(text)):
            if "/" in value:
                assert value.startswith((weights + "/", job_dir + "/")), f"{rel} {key}: {value}"


def test_extraction_and_training_read_one_model_config(tmp_path: Path) -> None:
    result, files = _render(tmp_path)
    extract = parse_script(f"{result.job_dir}/feature_extract/feature_extraction.sh", files[SCRIPTS[1]])
    train = parse_script(f"{result.job_dir}/pretrain.sh", files["pretrain.sh"])
    assert extract.commands[0].value("--mm-model") == train.commands[0].value("--mm-model")
    assert extract.env.get("MULTI_STREAM_MEMORY_REUSE") == train.env.get("MULTI_STREAM_MEMORY_REUSE") == "1"
    assert extract.commands[0].value("--num-workers") == "8"  # stock extract_feature.sh


def test_the_dit_has_one_shape_from_training_to_sampling(tmp_path: Path) -> None:
    result, files = _render(tmp_path)
    train = json.loads(files["pretrain_model.json"])["predictor"]
    sample = json.loads(files["inference_model.json"])["predictor"]
    assert {k: train[k] for k in SHAPE_KEYS} == {k: sample[k] for k in SHAPE_KEYS}
    assert train["cross_attention_dim"] == train["num_heads"] * train["head_dim"]
    # the released OpenSoraT2V_v1_3-2B/122 that LOAD_PATH is converted from
    assert (train["num_layers"], train["num_heads"], train["head_dim"]) == (32, 24, 96)
    tp = (
        parse_script(f"{result.job_dir}/pretrain.sh", files["pretrain.sh"])
        .commands[0]
        .value("--tensor-model-parallel-size")
    )
    assert tp is not None and train["num_heads"] % int(tp) == 0
    # the sampler's precision flag and its configs agree (stock inference_t2v.sh: --fp16)
    launch = parse_script(f"{result.job_dir}/inference.sh", files["inference.sh"]).commands[0]
    assert "--fp16" in launch.flags and "--bf16" not in launch.flags
    config = json.loads(files["inference_model.json"])
    assert {config["dtype"], sample["dtype"], config["ae"]["dtype"], config["text_encoder"]["dtype"]} == {
        "fp16"
    }
    assert (
        config["prompt"] == f"{result.job_dir}/samples_prompts.txt" and files["samples_prompts.txt"].strip()
    )


def test_pipeline_layers_follow_the_requested_pp(tmp_path: Path) -> None:
    _, stock = _render(tmp_path / "pp1")
    assert json.loads(stock["pretrain_model.json"])["predictor"]["pipeline_num_layers"] == [8, 8, 8, 8]
    _, files = _render(tmp_path / "pp2", tp=4, pp=2)
    assert json.loads(files["pretrain_model.json"])["predictor"]["pipeline_num_layers"] == [16, 16]
