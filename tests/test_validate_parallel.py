"""Parallel rules from the script's TP/PP/CP/VPP/GBS and the model json (Wan2.1 DiT and Qwen2.5-VL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_validate_support import assert_one, copy_job, edit_json, new_findings, sub


@pytest.fixture
def wan(tmp_path: Path) -> Path:
    return copy_job(tmp_path, "wan21_t2v")


@pytest.fixture
def vlm(tmp_path: Path) -> Path:
    return copy_job(tmp_path, "qwen25vl_3b")


def _set(job: Path, script: str, **values: object) -> None:
    for name, value in values.items():
        sub(job / script, rf"^{name}=.*$", f"{name}={value}")


def _layers(
    job: Path, value: object, *, model: str = "pretrain_model.json", section: str = "predictor"
) -> None:
    def change(d: dict) -> None:
        node = d
        for part in section.split("."):
            node = node[part]
        node["pipeline_num_layers"] = value

    edit_json(job / model, change)


# ---- Wan (DiT) -------------------------------------------------------------------------------------------
def test_wan_heads_divisible_by_cp(wan: Path) -> None:
    found = new_findings(wan, lambda: _set(wan, "pretrain.sh", CP=8))
    f = assert_one(
        found, "parallel.heads_divisible", "error", wan / "pretrain_model.json", "predictor.num_heads"
    )
    assert "not divisible by CP=8" in f.message and "[1, 2, 3, 4, 6, 12]" in f.fix


def test_world_size_divisible(wan: Path) -> None:
    found = new_findings(wan, lambda: _set(wan, "pretrain.sh", TP=3))
    f = assert_one(found, "parallel.world_size", "error", wan / "pretrain.sh", "TP")
    assert "world_size (8) is not divisible by 3" in f.message


def test_gbs_divisible_by_mbs_times_dp(wan: Path) -> None:
    found = new_findings(wan, lambda: _set(wan, "pretrain.sh", GBS=3))
    f = assert_one(found, "parallel.gbs", "error", wan / "pretrain.sh", "GBS")
    assert (
        "global batch size (3) is not divisible by micro batch size (1) times data parallel size (8)"
        in f.message
    )


def test_layers_sum(wan: Path) -> None:
    found = new_findings(wan, lambda: _layers(wan, [7, 8, 8, 8]))
    f = assert_one(
        found, "pp.layers_sum", "error", wan / "pretrain_model.json", "predictor.pipeline_num_layers"
    )
    assert "sums to 31 but num_layers is 30" in f.message


def test_layers_count_must_match_pp(wan: Path) -> None:
    found = new_findings(wan, lambda: _set(wan, "pretrain.sh", PP=2))
    f = assert_one(
        found, "pp.layers_count", "error", wan / "pretrain_model.json", "predictor.pipeline_num_layers"
    )
    assert "[15, 15]" in f.fix


def test_pp_layers_ok(wan: Path) -> None:
    assert not new_findings(wan, lambda: (_set(wan, "pretrain.sh", PP=2), _layers(wan, [15, 15])))


def test_pp_layers_missing(wan: Path) -> None:
    def change() -> None:
        _set(wan, "pretrain.sh", PP=2)
        edit_json(wan / "pretrain_model.json", lambda d: d["predictor"].pop("pipeline_num_layers"))

    f = assert_one(
        new_findings(wan, change), "pp.layers_missing", "error", wan / "pretrain_model.json", "predictor"
    )
    assert "must be specified in the config for pipeline parallel" in f.message


def test_null_pp_layers_is_no_split(wan: Path) -> None:
    """`pipeline_num_layers: null` (the stock CogVideoX configs) is accepted at PP=1, as MindSpeed-MM does,
    and is the missing-list error at PP=2."""
    assert not new_findings(wan, lambda: _layers(wan, None))
    f = assert_one(
        new_findings(wan, lambda: (_set(wan, "pretrain.sh", PP=2), _layers(wan, None))),
        "pp.layers_missing",
        "error",
        wan / "pretrain_model.json",
        "predictor",
    )
    assert "must be specified" in f.message


def test_vpp_needs_nested_lists(wan: Path) -> None:
    def change() -> None:
        _set(wan, "pretrain.sh", PP=2, VP=2)
        _layers(wan, [15, 15])

    assert_one(
        new_findings(wan, change),
        "pp.vpp_shape",
        "error",
        wan / "pretrain_model.json",
        "predictor.pipeline_num_layers",
    )


def test_vpp_nested_ok(wan: Path) -> None:
    assert not new_findings(
        wan, lambda: (_set(wan, "pretrain.sh", PP=2, VP=2), _layers(wan, [[7, 8], [8, 7]]))
    )


def test_layers_wrong_type(wan: Path) -> None:
    assert_one(
        new_findings(wan, lambda: _layers(wan, "7,8,8,7")),
        "keys.type",
        "error",
        wan / "pretrain_model.json",
        "predictor.pipeline_num_layers",
    )


# ---- Qwen2.5-VL ------------------------------------------------------------------------------------------
SCRIPT = "finetune_qwen2_5_vl_3b.sh"
LLM = "text_decoder"
VIT = "image_encoder.vision_encoder"


def _vlm_pp(job: Path, llm: list[int], vit: list[int]) -> None:
    _set(job, SCRIPT, PP=len(llm))
    _layers(job, llm, model="model.json", section=LLM)
    _layers(job, vit, model="model.json", section=VIT)


def test_vlm_pp_ok(vlm: Path) -> None:
    assert not new_findings(vlm, lambda: _vlm_pp(vlm, [6, 10, 10, 10], [32, 0, 0, 0]))


def test_vlm_query_groups(vlm: Path) -> None:
    found = new_findings(vlm, lambda: _set(vlm, SCRIPT, TP=4))
    f = assert_one(
        found, "parallel.query_groups", "error", vlm / "model.json", "text_decoder.num_query_groups"
    )
    assert "TP=4" in f.message and "[1, 2]" in f.fix


def test_vlm_heads_divisible_by_tp_cp(vlm: Path) -> None:
    def change() -> None:
        _set(vlm, SCRIPT, CP=2)
        edit_json(vlm / "model.json", lambda d: d["text_decoder"].update(num_attention_heads=15))

    f = assert_one(
        new_findings(vlm, change),
        "parallel.heads_divisible",
        "error",
        vlm / "model.json",
        "text_decoder.num_attention_heads",
    )
    assert "TP×CP=1×2" in f.message


def test_vlm_layers_count(vlm: Path) -> None:
    def change() -> None:
        _set(vlm, SCRIPT, PP=4)
        _layers(vlm, [32, 0, 0, 0], model="model.json", section=VIT)

    assert_one(
        new_findings(vlm, change),
        "pp.layers_count",
        "error",
        vlm / "model.json",
        "text_decoder.pipeline_num_layers",
    )


def test_vlm_zero_llm_stage(vlm: Path) -> None:
    found = new_findings(vlm, lambda: _vlm_pp(vlm, [0, 12, 12, 12], [32, 0, 0, 0]))
    f = assert_one(
        found, "pp.zero_llm_stage", "error", vlm / "model.json", "text_decoder.pipeline_num_layers"
    )
    assert "learning_rate is None" in f.message


def test_vlm_vit_after_llm(vlm: Path) -> None:
    found = new_findings(vlm, lambda: _vlm_pp(vlm, [1, 10, 10, 15], [30, 2, 0, 0]))
    f = assert_one(
        found,
        "pp.vit_after_llm",
        "error",
        vlm / "model.json",
        "image_encoder.vision_encoder.pipeline_num_layers",
    )
    assert "[32, 0, 0, 0]" in f.fix


def test_vlm_layers_sum(vlm: Path) -> None:
    found = new_findings(vlm, lambda: _vlm_pp(vlm, [9, 9, 9, 8], [32, 0, 0, 0]))
    assert_one(found, "pp.layers_sum", "error", vlm / "model.json", "text_decoder.pipeline_num_layers")
