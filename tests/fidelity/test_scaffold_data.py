"""What `mm-agent new-model` knows about MindSpeed-MM's new-model flow (registry/data/new_model.yaml), re-found in
MindSpeed-MM's own trees: the guide's words for each file, the interfaces the scaffolded files import, the
releases refused, the guide's config values and each base's sections and sizes in its stock example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from mm_agent.scaffold.plan import missing_interfaces
from mm_agent.scaffold.spec import load_spec

SPEC = load_spec()
TREES = {"26.1.0": "v26.1.0", "master": "master-57069cd"}
REFUSED_TREES = {"26.0.0": "v26.0.0", "2.3.0": "v2.3.0", "2.2.0": "v2.2.0", "2.1.0": "v2.1.0"}


def _tree(upstream: Path, version: str) -> Path:
    tree = upstream / "MindSpeed-MM" / (TREES | REFUSED_TREES)[version]
    if not tree.is_dir():
        pytest.skip(f"{tree} is missing")
    return tree


def _block(guide: str, heading: str, lang: str) -> str:
    """The first ```lang block after `heading` in the guide."""
    after = guide[guide.index(heading) :]
    match = re.search(rf"```{lang}\n(.*?)```", after, re.S)
    assert match, f"no {lang} block after {heading!r}"
    return match.group(1)


def test_every_supported_version_is_a_tree_here() -> None:
    assert set(SPEC.versions) == set(TREES)
    assert {v for r in SPEC.refused for v in r.versions} == set(REFUSED_TREES)


@pytest.mark.parametrize("version", sorted(TREES))
def test_the_guide_says_what_the_data_quotes(upstream: Path, version: str) -> None:
    guide = (_tree(upstream, version) / SPEC.guide).read_text(encoding="utf-8")
    for item in SPEC.files:
        assert item.guide in guide, f"{item.role}: {item.guide!r} is not in the {version} guide"
    assert SPEC.registration.guide in guide
    # the `differs` notes rest on the guide's own words
    assert "新建 `data/datasets/custom_t2v_dataset.py`" in guide
    assert "新建 `mindspeed_mm/pretrain_custom.py`" in guide
    assert "- predictor.head" in guide and "self.head" not in guide


@pytest.mark.parametrize("version", sorted(TREES))
def test_every_interface_the_scaffold_imports_is_in_the_tree(upstream: Path, version: str) -> None:
    assert missing_interfaces(_tree(upstream, version), SPEC.interfaces) == []


@pytest.mark.parametrize("version", sorted(REFUSED_TREES))
def test_a_refused_release_has_no_guide(upstream: Path, version: str) -> None:
    assert not (_tree(upstream, version) / SPEC.guide).exists()


@pytest.mark.parametrize("version", sorted(TREES))
def test_the_guide_config_values_are_kept(upstream: Path, version: str) -> None:
    guide = (_tree(upstream, version) / SPEC.guide).read_text(encoding="utf-8")
    data = json.loads(_block(guide, "### data.json", "json"))
    param = data["dataset_param"]
    assert (param["num_frames"], param["max_height"], param["max_width"]) == (
        SPEC.data.num_frames, SPEC.data.max_height, SPEC.data.max_width,
    )  # fmt: skip
    assert param["tokenizer_config"]["model_max_length"] == SPEC.data.model_max_length
    assert data["dataloader_param"] == SPEC.data.dataloader_param
    fsdp2 = yaml.safe_load(_block(guide, "### fsdp2_config.yaml", "yaml"))
    ours = dict(SPEC.fsdp2)
    # the one declared difference: the guide also wraps predictor.head, which its DiT does not have
    assert fsdp2.pop("sub_modules_to_wrap") == [*ours.pop("sub_modules_to_wrap"), "predictor.head"]
    assert fsdp2 == ours
    model = json.loads(_block(guide, "### model.json", "json"))
    assert model["diffusion"] == SPEC.diffusion
    keys = set(model["predictor"]) - {"model_id"}
    assert keys == set(SPEC.bases[0].arch.model_dump())  # the DiT's constructor keys


@pytest.mark.parametrize("version", sorted(TREES))
@pytest.mark.parametrize("base", [b.id for b in SPEC.bases])
def test_each_base_matches_its_stock_example(upstream: Path, version: str, base: str) -> None:
    tree = _tree(upstream, version)
    spec = SPEC.base(base)
    assert spec is not None
    stock = json.loads((tree / spec.stock.predictor).read_text(encoding="utf-8"))
    p, arch = stock["predictor"], spec.arch
    assert p["hidden_size"] == arch.num_heads * arch.head_dim and p["num_heads"] == arch.num_heads
    assert (p["num_layers"], p["ffn_dim"], p["freq_dim"], p["text_dim"]) == (
        arch.num_layers, arch.ffn_dim, arch.freq_dim, arch.text_dim,
    )  # fmt: skip
    assert (p["in_dim"], p["out_dim"], p["patch_size"], p["max_seq_len"]) == (
        arch.in_channels, arch.out_channels, list(arch.patch_size), arch.rope_max_seq_len,
    )  # fmt: skip
    for key, value in SPEC.diffusion.items():
        assert stock["diffusion"][key] == value, key
    encoders = json.loads((tree / spec.stock.encoders).read_text(encoding="utf-8"))
    for part, ours in (("ae", spec.ae), ("text_encoder", spec.text_encoder)):
        theirs = {k: v for k, v in encoders[part].items() if k != "from_pretrained"}
        assert theirs == ours, part
    assert spec.hf_id.startswith("Wan-AI/" + spec.model.replace("wan", "Wan") + "-")
