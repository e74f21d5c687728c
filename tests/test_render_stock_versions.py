"""Each MindSpeed-MM version's job carries that version's own stock values, not another version's.

Where a stock example changed between 26.0.0 and 26.1.0 (layout, micro batch, launcher environment, data settings),
the registry says so per size (`sizes[].changes`, schema.SizeChange) and `render_job` applies it, so a 26.0.0 job
equals the 26.0.0 example and a 26.1.0 job the 26.1.0 one. The numbers below are the stock examples' (cited per
test); tests/fidelity/test_stock_vlm.py compares every file with upstream itself. These run without upstream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry, SizeChange, SizeSpec
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_script


def _files(tmp_path: Path, model: str, task: str, size: str, version: str, **kw: Any) -> dict[str, str]:
    out = tmp_path / f"{model}-{task}-{size}-{version}"
    result = render_job(
        RenderRequest(model=model, task=task, size=size, mm_version=version, out_dir=str(out), **kw)  # type: ignore[arg-type]
    )
    return {f.path: f.content or "" for f in result.files}


def _launch(files: dict[str, str], script: str) -> dict[str, list[str | None]]:
    info = parse_script(script, files[script])
    assert info.commands, f"{script}: no launch command"
    return info.commands[0].launcher_flags


@pytest.mark.parametrize(
    ("size", "version", "npus", "nodes", "mbs"),
    [
        # v26.0.0 examples/qwen3_5/finetune_qwen3_5_27B.sh:10,13 and qwen3_5_27B_config.yaml:91
        ("27b", "26.0.0", "8", "2", 1),
        # v26.1.0 finetune_qwen3_5_27B.sh:15,18 and qwen3_5_27B_config.yaml:123 (with activation offload, chunk loss)
        ("27b", "26.1.0", "16", "1", 2),
        ("35b", "26.0.0", "8", "2", 1),  # v26.0.0 finetune_qwen3_5_35B.sh:10,13, qwen3_5_35B_config.yaml:104
        ("35b", "26.1.0", "16", "1", 4),  # v26.1.0 :15,18 and :146
        ("397b", "26.0.0", "16", "16", 1),  # v26.0.0 qwen3_5_397B_config.yaml:103
        ("397b", "26.1.0", "16", "16", 2),  # v26.1.0 qwen3_5_397B_config.yaml:137
    ],
)
def test_qwen35_layout_and_micro_batch_are_the_versions_own(
    tmp_path: Path, size: str, version: str, npus: str, nodes: str, mbs: int
) -> None:
    files = _files(tmp_path, "qwen3_5", "sft", size, version)
    flags = _launch(files, "train.sh")
    assert (flags["--nproc_per_node"], flags["--nnodes"]) == ([npus], [nodes])
    config = yaml.safe_load(files["config.yaml"])
    assert config["training"]["micro_batch_size"] == mbs
    if version == "26.1.0":  # the micro batch of 26.1.0 goes with its activation offload and chunk loss
        assert config["features"]["enable_activation_offload"] is True
        assert config["features"]["enable_chunk_loss"] is True
    else:
        assert "features" not in config or "enable_activation_offload" not in config["features"]


def test_qwen35_122b_launcher_environment_is_the_versions_own(tmp_path: Path) -> None:
    """v26.0.0 finetune_qwen3_5_122B.sh:2-3 exports NON_MEGATRON and MULTI_STREAM_MEMORY_REUSE only; 26.1.0 :5-9
    adds the NPU tuning variables."""
    tuning = {"TASK_QUEUE_ENABLE", "ASCEND_LAUNCH_BLOCKING", "ACLNN_CACHE_LIMIT", "CPU_AFFINITY_CONF"}
    old = parse_script("train.sh", _files(tmp_path, "qwen3_5", "sft", "122b", "26.0.0")["train.sh"]).env
    new = parse_script("train.sh", _files(tmp_path, "qwen3_5", "sft", "122b", "26.1.0")["train.sh"]).env
    assert not tuning & set(old) and old.get("MULTI_STREAM_MEMORY_REUSE") == "2"
    assert tuning <= set(new)


@pytest.mark.parametrize(("version", "mbs", "lr"), [("26.0.0", 1, 2.0e-5), ("26.1.0", 2, 1.0e-6)])
def test_qwen3tts_micro_batch_goes_with_its_versions_lr(
    tmp_path: Path, version: str, mbs: int, lr: float
) -> None:
    """qwen3tts_config.yaml: 26.0.0 micro_batch_size 1 with lr 2.0e-5 (:49,52); 26.1.0 2 with 1e-6 (:53,56). No
    `load`: the stock trains from the HF weights (`# load: load_path`), and no converter writes a DCP folder."""
    config = yaml.safe_load(_files(tmp_path, "qwen3tts", "tts", "1.7b", version)["config.yaml"])
    assert (config["training"]["micro_batch_size"], config["training"]["lr"]) == (mbs, lr)
    assert "load" not in config["training"]
    assert config["training"]["init_model_with_meta_device"] is False


@pytest.mark.parametrize("version", ["26.0.0", "26.1.0"])
def test_qwen3vl_lora_renders_its_stock_launcher(tmp_path: Path, version: str) -> None:
    """finetune_lora_qwen3vl_30B.sh: one node of 8 at both versions; 26.1.0's exports ENABLE_GC_THRESHOLD=1 (:19),
    which pretrain_transformers.py:15-19 reads."""
    files = _files(tmp_path, "qwen3vl", "lora", "30b", version)
    assert _launch(files, "finetune.sh")["--nproc_per_node"] == ["8"]
    env = parse_script("finetune.sh", files["finetune.sh"]).env
    assert env.get("ENABLE_GC_THRESHOLD") == ("1" if version == "26.1.0" else None)
    sft = parse_script("finetune.sh", _files(tmp_path, "qwen3vl", "sft", "30b", version)["finetune.sh"]).env
    assert "ENABLE_GC_THRESHOLD" not in sft  # the SFT launcher does not export it


@pytest.mark.parametrize(("version", "pixels"), [("26.0.0", 1048576), ("26.1.0", 262144)])
def test_qwen3vl_32b_image_budget_is_the_versions_own(tmp_path: Path, version: str, pixels: int) -> None:
    """qwen3vl_full_sft_32B.yaml: image_max_pixels 1048576 at 26.0.0, 262144 at 26.1.0."""
    files = _files(tmp_path, "qwen3vl", "sft", "32b", version, backend="megatron+fsdp2")
    data = yaml.safe_load(files["train.yaml"])["data"]
    assert data["dataset_param"]["preprocess_parameters"]["image_max_pixels"] == pixels


def test_qwen3omni_26_0_renders_its_own_cache_env_and_patches(tmp_path: Path) -> None:
    """v26.0.0 examples/qwen3omni: data.json:22 overwrite_cache true, no MULTI_STREAM_MEMORY_REUSE export, no
    model patch section; 26.1.0: false, =2 (finetune_qwen3omni.sh:18), clip_grad_async (model.json:47)."""
    for version, cache, reuse, patch in (
        ("26.0.0", True, None, None),
        ("26.1.0", False, "2", {"clip_grad_async": True}),
    ):
        files = _files(tmp_path, "qwen3omni", "sft", "30b", version, backend="megatron+fsdp2")
        train = yaml.safe_load(files["train.yaml"])
        assert train["data"]["dataset_param"]["basic_parameters"]["overwrite_cache"] is cache, version
        assert train["model"].get("patch") == patch, version
        assert (
            parse_script("finetune.sh", files["finetune.sh"]).env.get("MULTI_STREAM_MEMORY_REUSE") == reuse
        ), version


def test_a_request_still_wins_over_the_versions_layout(tmp_path: Path) -> None:
    files = _files(tmp_path, "qwen3_5", "sft", "27b", "26.0.0", npus_per_node=16, nnodes=1, mbs=2)
    flags = _launch(files, "train.sh")
    assert (flags["--nproc_per_node"], flags["--nnodes"]) == (["16"], ["1"])
    assert yaml.safe_load(files["config.yaml"])["training"]["micro_batch_size"] == 2


def test_size_changes_apply_by_version_and_task() -> None:
    size = get_registry().get("qwen3vl").size("30b")
    assert size is not None
    assert size.arch_at("26.1.0", "lora", "megatron+fsdp2")["env"] == {"ENABLE_GC_THRESHOLD": "1"}
    assert "env" not in size.arch_at("26.0.0", "lora", "megatron+fsdp2")
    assert "env" not in size.arch_at("26.1.0", "sft", "megatron+fsdp2")
    q35 = get_registry().get("qwen3_5").size("27b")
    assert q35 is not None
    assert (q35.parallel_at("26.0.0").npus_per_node, q35.parallel_at("26.0.0").nnodes) == (8, 2)
    assert q35.parallel_at("26.1.0") == q35.parallel


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"parallel": {"npus": 8}, "source": "a stock script somewhere"}, "not Parallel fields"),
        ({"source": "a stock script somewhere"}, "sets parallel or arch"),
        ({"parallel": {"mbs": 2}}, "source"),
        ({"parallel": {"mbs": 0}, "source": "a stock script somewhere"}, "greater than or equal to 1"),
    ],
)
def test_bad_size_change_is_refused(change: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        SizeSpec.model_validate({"id": "7b", "changes": [change]})


def test_a_change_for_a_task_the_model_lacks_is_refused() -> None:
    raw = get_registry().get("qwen3tts").model_dump(by_alias=True)
    raw["sizes"][0]["changes"] = [
        {"task": "lora", "parallel": {"mbs": 1}, "source": "a stock script somewhere"}
    ]
    with pytest.raises(ValidationError, match="names task lora"):
        ModelEntry.model_validate(raw)
    assert SizeChange(task="tts", parallel={"mbs": 1}, source="a stock script").applies("26.0.0", "tts", None)
