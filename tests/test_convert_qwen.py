"""Qwen2_5_VLConverter natively: the ops against hand-computed layouts, exact MindSpeed-MM rank files at
TP=1/2, PP=1/2 and VPP, bitwise round trips that transformers loads, tied embeddings, both HF namings,
and the refusals (tp > KV heads, bad splits, unknown keys).

Tiny `Qwen2_5_VLForConditionalGeneration`s (LLM: 4 layers, hidden 64, 4 heads, 2 KV heads; ViT: depth 2,
hidden 32, 2 heads) are built from configs and saved with `save_pretrained`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from mm_agent.convert import ops  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.manifest import MANIFEST, read_manifest  # noqa: E402
from mm_agent.convert.mapping import MAPPINGS_DIR, Transform, load_mapping  # noqa: E402
from mm_agent.convert.plan import plan_conversion  # noqa: E402
from mm_agent.convert.schema import ConvertReport, ConvertRequest  # noqa: E402
from mm_agent.convert.vlm import Dims, check_heads, load_table  # noqa: E402
from mm_agent.errors import MMAgentError  # noqa: E402

QWEN = "Qwen2_5_VLConverter"
TRACKER = "latest_checkpointed_iteration.txt"

# MindSpeed-MM qwen2_5vl names, written out here (reference §2.5), not derived from the table under test.
VIT = "image_encoder.encoder.blocks.layers."
LLM = "text_decoder.decoder.layers."
VIT_LAYER = {
    "input_layernorm.weight", "pre_mlp_layernorm.weight",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias",
}  # fmt: skip
LLM_LAYER = {
    "input_layernorm.weight", "pre_mlp_layernorm.weight",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", "self_attention.linear_proj.weight",
    "mlp.linear_fc1.weight", "mlp.linear_fc2.weight",
}  # fmt: skip
VIT_FIRST = {"image_encoder.encoder.patch_embed.proj.weight"}
VIT_LAST = {
    "image_encoder.projector.layernorm.weight",
    *(f"image_encoder.projector.encoder.linear_fc{i}.{p}" for i in (1, 2) for p in ("weight", "bias")),
}
LLM_FIRST = {"text_decoder.embedding.word_embeddings.weight"}
LLM_LAST = {"text_decoder.decoder.final_layernorm.weight", "text_decoder.output_layer.weight"}
# Per-rank shapes at TP=2 (hidden 64, head_dim 16, q 64 + k 32 + v 32 rows, ffn 96, vocab 128; ViT hidden 32,
# ffn 48, merger 128 -> 64), worked out by hand from the config below.
SHAPES_TP2 = {
    "text_decoder.embedding.word_embeddings.weight": (64, 64),
    "text_decoder.output_layer.weight": (64, 64),
    f"{LLM}0.self_attention.linear_qkv.weight": (64, 64),
    f"{LLM}0.self_attention.linear_qkv.bias": (64,),
    f"{LLM}0.self_attention.linear_proj.weight": (64, 32),
    f"{LLM}0.mlp.linear_fc1.weight": (96, 64),
    f"{LLM}0.mlp.linear_fc2.weight": (64, 48),
    f"{LLM}0.input_layernorm.weight": (64,),
    f"{VIT}0.self_attention.linear_qkv.weight": (48, 32),
    f"{VIT}0.self_attention.linear_proj.weight": (32, 16),
    f"{VIT}0.self_attention.linear_proj.bias": (32,),
    f"{VIT}0.mlp.linear_fc1.weight": (48, 32),
    f"{VIT}0.mlp.linear_fc1.bias": (48,),
    f"{VIT}0.mlp.linear_fc2.weight": (32, 24),
    f"{VIT}0.mlp.linear_fc2.bias": (32,),
    "image_encoder.projector.encoder.linear_fc1.weight": (64, 128),
    "image_encoder.projector.encoder.linear_fc2.weight": (64, 64),
    "image_encoder.projector.encoder.linear_fc2.bias": (64,),
    "image_encoder.encoder.patch_embed.proj.weight": (32, 3, 2, 14, 14),
}


def mm_keys(vit: int = 0, llm: int = 0, *parts: set[str]) -> set[str]:
    """Keys of one MM state dict: `vit`/`llm` layers numbered from 0 plus the given first/last names."""
    keys = {f"{VIT}{i}.{s}" for i in range(vit) for s in VIT_LAYER}
    keys |= {f"{LLM}{i}.{s}" for i in range(llm) for s in LLM_LAYER}
    for part in parts:
        keys |= part
    return keys


def build_model(path: Path, tie: bool = False, shard: str | None = None) -> Path:
    config = transformers.Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}, "tie_word_embeddings": tie,
            "bos_token_id": 1, "eos_token_id": 2,
        },
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64},
        tie_word_embeddings=tie,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """plain (hub naming, untied), tied, newer (transformers >= 4.52 names), sharded (with an index)."""
    root = tmp_path_factory.mktemp("qwen")
    plain = build_model(root / "plain")
    newer = root / "newer"
    newer.mkdir()
    shutil.copy(plain / "config.json", newer)
    renamed = {}
    for key, value in load_file(plain / "model.safetensors").items():
        prefix = (
            "model.language_model."
            if key.startswith("model.")
            else "model."
            if key.startswith("visual.")
            else ""
        )
        renamed[prefix + (key[len("model.") :] if key.startswith("model.") else key)] = value
    save_file(renamed, newer / "model.safetensors", metadata={"format": "pt"})
    return {
        "plain": plain,
        "tied": build_model(root / "tied", tie=True),
        "newer": newer,
        "sharded": build_model(root / "sharded", shard="300KB"),
    }


def convert(method: str, source: Path, target: Path, **kw: Any) -> ConvertReport:
    return execute(
        ConvertRequest(
            converter=QWEN, method=method, source=str(source), target=str(target), confirm=True, **kw
        )
    )


def hf_state(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def rank(target: Path, rel: str) -> dict[str, Any]:
    return torch.load(target / "release" / rel / "model_optim_rng.pt", weights_only=True)


# ---------------------------------------------------------------------------------------------------------
# ops against hand-computed layouts


def rows(*values: int) -> torch.Tensor:
    """A (n, 2) weight whose row i is [v_i, v_i]: row identities survive every reordering."""
    return torch.tensor(values, dtype=torch.float32).repeat_interleave(2).view(-1, 2)


def test_merge_qkv_interleaves_by_kv_group() -> None:
    # 4 query heads, 2 KV heads, head_dim 1: group g = [q_2g, q_2g+1, k_g, v_g]
    q, k, v = rows(0, 1, 2, 3), rows(10, 11), rows(20, 21)
    assert torch.equal(ops.merge_qkv(q, k, v, 2), rows(0, 1, 10, 20, 2, 3, 11, 21))
    assert torch.equal(ops.merge_qkv(q[:, 0], k[:, 0], v[:, 0], 2), rows(0, 1, 10, 20, 2, 3, 11, 21)[:, 0])
    # TP rank 1 of 2 holds the second group, built from the rank's slices only
    assert torch.equal(ops.merge_qkv(q, k, v, 2, rank=1, tp=2), rows(2, 3, 11, 21))


def test_split_qkv_inverts_merge_for_every_tp() -> None:
    q, k, v = torch.randn(8, 3), torch.randn(4, 3), torch.randn(4, 3)  # 4 heads, 2 KV, head_dim 2
    for tp in (1, 2):
        parts = [ops.merge_qkv(q, k, v, 2, rank=r, tp=tp) for r in range(tp)]
        pieces = ops.split_qkv(parts, 2, 4)
        for original, got in zip((q, k, v), pieces, strict=True):
            assert torch.equal(torch.cat(got), original)


def test_relocate_qkv_interleaves_per_head() -> None:
    fused = rows(0, 1, 10, 11, 20, 21)  # [q_h0, q_h1, k_h0, k_h1, v_h0, v_h1], head_dim 1
    assert torch.equal(ops.relocate_qkv(fused, 2), rows(0, 10, 20, 1, 11, 21))
    assert torch.equal(ops.relocate_qkv(fused, 2, rank=1, tp=2), rows(1, 11, 21))
    parts = [ops.relocate_qkv(fused, 2, rank=r, tp=2) for r in range(2)]
    assert torch.equal(ops.unrelocate_qkv(parts, 2), fused)


def test_gate_up_merge_and_glu_split() -> None:
    gate, up = rows(0, 1, 2, 3), rows(10, 11, 12, 13)
    assert torch.equal(ops.merge_gate_up(gate, up), rows(0, 1, 2, 3, 10, 11, 12, 13))
    parts = [ops.merge_gate_up(gate, up, rank=r, tp=2) for r in range(2)]
    assert torch.equal(parts[1], rows(2, 3, 12, 13))  # rank r = [gate_r; up_r]
    got_gate, got_up = ops.split_gate_up(parts)
    assert torch.equal(torch.cat(got_gate), gate) and torch.equal(torch.cat(got_up), up)


def test_split_tp_refuses_remainder_and_writes_into_out() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        ops.split_tp(torch.zeros(5, 2), 2, 0)
    out = torch.empty(4, 2)
    assert ops.merge_gate_up(rows(0, 1), rows(2, 3), out=out).data_ptr() == out.data_ptr()


# ---------------------------------------------------------------------------------------------------------
# table


def test_table_wildcards_are_checked_at_load() -> None:
    with pytest.raises(ValueError, match="wildcard count mismatch"):
        Transform(op="rename", mm="a.*.w", hf=["b.w"])


def test_tp_must_divide_kv_heads_and_vit_heads() -> None:
    table = load_table(QWEN)
    dims = Dims.from_config(
        {"num_key_value_heads": 4, "num_attention_heads": 8, "vision_config": {"num_heads": 2}}
    )
    check_heads(table, dims, 2)
    with pytest.raises(MMAgentError, match=r"attention heads \(2\) must be divisible by TP size \(4\)"):
        check_heads(table, dims, 4)


# ---------------------------------------------------------------------------------------------------------
# hf_to_mm layouts


def test_tp1_pp1_single_rank_file(models: dict[str, Path], tmp_path: Path) -> None:
    report = convert("hf_to_mm", models["plain"], tmp_path / "mm")
    assert report.status == "converted" and report.keys_converted == 2 * 10 + 4 * 7 + 1 + 5 + 1 + 2
    assert (tmp_path / "mm" / TRACKER).read_text() == "release"
    assert sorted(p.name for p in (tmp_path / "mm" / "release").iterdir()) == ["mp_rank_00"]
    obj = rank(tmp_path / "mm", "mp_rank_00")
    assert set(obj) == {"model", "checkpoint_version"} and obj["checkpoint_version"] == 3.0
    assert set(obj["model"]) == mm_keys(2, 4, VIT_FIRST, VIT_LAST, LLM_FIRST, LLM_LAST)


def test_tp2_pp2_layout_shapes_and_values(models: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "mm"
    report = convert("hf_to_mm", models["plain"], target, tp=2, pp_layers=[1, 3], vit_pp_layers=[2, 0])
    for entry in report.files:  # a shard is saved alone, not with the whole tensor it was sliced from
        assert entry.bytes < (target / entry.path).stat().st_size < entry.bytes + 64 * 1024
    dirs = sorted(p.name for p in (target / "release").iterdir())
    assert dirs == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    for tp_rank in ("00", "01"):
        first, last = (
            rank(target, f"mp_rank_{tp_rank}_000")["model"],
            rank(target, f"mp_rank_{tp_rank}_001")["model"],
        )
        assert set(first) == mm_keys(2, 1, VIT_FIRST, VIT_LAST, LLM_FIRST)  # ViT + projector on stage 0
        assert set(last) == mm_keys(0, 3, LLM_LAST)  # LLM layers 1..3 renumbered 0..2
        merged = {**first, **last}
        assert {k: tuple(merged[k].shape) for k in SHAPES_TP2} == SHAPES_TP2
    hf = hf_state(models["plain"])
    r1_first, r1_last = rank(target, "mp_rank_01_000")["model"], rank(target, "mp_rank_01_001")["model"]
    a = "model.layers.0.self_attn."
    # LLM qkv of TP rank 1 = KV group 1: q heads 2,3 (rows 32..63), k/v head 1 (rows 16..31)
    want_qkv = torch.cat(
        [hf[f"{a}q_proj.weight"][32:], hf[f"{a}k_proj.weight"][16:], hf[f"{a}v_proj.weight"][16:]]
    )
    assert torch.equal(r1_first[f"{LLM}0.self_attention.linear_qkv.weight"], want_qkv)
    # ViT qkv of TP rank 1 = head 1 of the fused [q; k; v] rows (32 each, head_dim 16)
    fused = hf["visual.blocks.1.attn.qkv.weight"]
    assert torch.equal(
        r1_first[f"{VIT}1.self_attention.linear_qkv.weight"],
        torch.cat([fused[16:32], fused[48:64], fused[80:96]]),
    )
    # gated fc1 of rank 1 = [gate rows 48..95; up rows 48..95]; stage-1 layer 0 is global layer 1
    b = "model.layers.1.mlp."
    assert torch.equal(
        r1_last[f"{LLM}0.mlp.linear_fc1.weight"],
        torch.cat([hf[f"{b}gate_proj.weight"][48:], hf[f"{b}up_proj.weight"][48:]]),
    )
    assert torch.equal(
        r1_last[f"{LLM}0.self_attention.linear_proj.weight"],
        hf["model.layers.1.self_attn.o_proj.weight"][:, 32:],
    )
    assert torch.equal(r1_last["text_decoder.output_layer.weight"], hf["lm_head.weight"][64:])
    assert torch.equal(r1_first[f"{VIT}0.mlp.linear_fc2.bias"], hf["visual.blocks.0.mlp.down_proj.bias"])


def test_vpp_nested_layout(models: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "mm"
    convert("hf_to_mm", models["plain"], target, pp_layers=[[1, 1], [1, 1]], vit_pp_layers=[[2, 0], [0, 0]])
    s0, s1 = rank(target, "mp_rank_00_000"), rank(target, "mp_rank_00_001")
    assert set(s0) == set(s1) == {"model0", "model1", "checkpoint_version"}
    assert set(s0["model0"]) == mm_keys(2, 1, VIT_FIRST, VIT_LAST, LLM_FIRST)
    assert set(s1["model0"]) == mm_keys(0, 1) and set(s0["model1"]) == mm_keys(0, 1)
    assert set(s1["model1"]) == mm_keys(0, 1, LLM_LAST)
    hf = hf_state(models["plain"])  # chunk-major: stage 1 chunk 0 is layer 1, stage 0 chunk 1 is layer 2
    assert torch.equal(
        s1["model0"][f"{LLM}0.input_layernorm.weight"], hf["model.layers.1.input_layernorm.weight"]
    )
    assert torch.equal(
        s0["model1"][f"{LLM}0.input_layernorm.weight"], hf["model.layers.2.input_layernorm.weight"]
    )
    manifest = read_manifest(target)
    assert manifest is not None and manifest.vpp == 2 and manifest.vit_pp_layers == [[2, 0], [0, 0]]


def test_single_nested_list_writes_model_not_model0(models: dict[str, Path], tmp_path: Path) -> None:
    # upstream's README form `[[36]]` / `[[32]]`: save_by_vpp writes "model" when there is one chunk
    convert("hf_to_mm", models["plain"], tmp_path / "mm", pp_layers=[[4]], vit_pp_layers=[[2]])
    assert set(rank(tmp_path / "mm", "mp_rank_00")) == {"model", "checkpoint_version"}


def test_tied_embeddings(models: dict[str, Path], tmp_path: Path) -> None:
    assert "lm_head.weight" not in hf_state(models["tied"])
    convert("hf_to_mm", models["tied"], tmp_path / "pp1")
    assert "text_decoder.output_layer.weight" not in rank(tmp_path / "pp1", "mp_rank_00")["model"]
    convert("hf_to_mm", models["tied"], tmp_path / "pp2", tp=2, pp_layers=[2, 2], vit_pp_layers=[2, 0])
    for r in ("00", "01"):  # the last stage gets the embedding as its output layer (upstream TieOp)
        first, last = (
            rank(tmp_path / "pp2", f"mp_rank_{r}_000")["model"],
            rank(tmp_path / "pp2", f"mp_rank_{r}_001")["model"],
        )
        assert torch.equal(
            last["text_decoder.output_layer.weight"], first["text_decoder.embedding.word_embeddings.weight"]
        )
    report = convert("mm_to_hf", tmp_path / "pp2", tmp_path / "hf", hf_dir=str(models["tied"]))
    assert [c.source for c in report.keys_dropped] == ["text_decoder.output_layer.weight"]
    assert_same_weights(models["tied"], tmp_path / "hf")


def test_rank_files_list_tensors_in_mindspeed_mm_order(models: dict[str, Path], tmp_path: Path) -> None:
    """MindSpeed-MM's operators pop the keys they consume and append what they make, in the order they run
    (ViT gate/up weight then bias merges, ViT down_proj rename, the big rename, LLM gate/up, q/k/v weight,
    q/k/v bias; TieOp last): the order below is worked out from its operator list, not from the table."""
    convert("hf_to_mm", models["plain"], tmp_path / "mm", pp_layers=[1, 3], vit_pp_layers=[2, 0])
    first = list(rank(tmp_path / "mm", "mp_rank_00_000")["model"])
    assert first[:9] == [
        f"{VIT}0.mlp.linear_fc1.weight", f"{VIT}1.mlp.linear_fc1.weight",
        f"{VIT}0.mlp.linear_fc1.bias", f"{VIT}1.mlp.linear_fc1.bias",
        f"{VIT}0.mlp.linear_fc2.bias", f"{VIT}0.mlp.linear_fc2.weight",
        f"{VIT}1.mlp.linear_fc2.bias", f"{VIT}1.mlp.linear_fc2.weight",
        "text_decoder.embedding.word_embeddings.weight",
    ]  # fmt: skip
    assert first[-3:] == [
        f"{LLM}0.mlp.linear_fc1.weight",
        f"{LLM}0.self_attention.linear_qkv.weight",
        f"{LLM}0.self_attention.linear_qkv.bias",
    ]
    convert("hf_to_mm", models["tied"], tmp_path / "tied", pp_layers=[2, 2], vit_pp_layers=[2, 0])
    assert list(rank(tmp_path / "tied", "mp_rank_00_001")["model"])[-1] == "text_decoder.output_layer.weight"


def test_upstream_steps_are_checked_at_load(tmp_path: Path) -> None:
    good = (MAPPINGS_DIR / f"{QWEN}.yaml").read_text()
    assert load_mapping(QWEN).upstream_ops[0].kind == "merge"
    cases = {  # a merge step of two transforms; a transform without a step; a step out of range
        "    upstream_step: 1\n": ("    upstream_step: 0\n", "a merge step is one transform"),
        ", upstream_step: 3}": ("}", "upstream_step must index upstream_ops"),
        "    upstream_step: 5\n": ("    upstream_step: 9\n", "upstream_step must index upstream_ops"),
    }
    for i, (old, (new, message)) in enumerate(cases.items()):
        assert old in good, old
        (tmp_path / str(i)).mkdir()  # a directory per case: load_mapping caches by (converter, directory)
        (tmp_path / str(i) / f"{QWEN}.yaml").write_text(good.replace(old, new, 1))
        with pytest.raises(MMAgentError, match=message):
            load_mapping(QWEN, tmp_path / str(i))


def test_newer_transformers_names_convert_the_same(models: dict[str, Path], tmp_path: Path) -> None:
    convert("hf_to_mm", models["plain"], tmp_path / "a", tp=2)
    convert("hf_to_mm", models["newer"], tmp_path / "b", tp=2)
    for r in ("mp_rank_00", "mp_rank_01"):
        a, b = rank(tmp_path / "a", r)["model"], rank(tmp_path / "b", r)["model"]
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    convert("mm_to_hf", tmp_path / "b", tmp_path / "hf")  # naming taken from the manifest's weight map
    assert "model.language_model.layers.0.self_attn.q_proj.weight" in hf_state(tmp_path / "hf")
    assert_same_weights(models["newer"], tmp_path / "hf")


# ---------------------------------------------------------------------------------------------------------
# round trips


def assert_same_weights(source: Path, exported: Path) -> None:
    """Bitwise equal tensors, and transformers loads the export."""
    want, got = hf_state(source), hf_state(exported)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(exported)
    state = model.state_dict()
    assert torch.equal(
        state["model.language_model.layers.3.self_attn.k_proj.bias"],
        want[_name(want, "layers.3.self_attn.k_proj.bias")],
    )


def _name(keys: dict[str, Any], suffix: str) -> str:
    return next(k for k in keys if k.endswith(suffix))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"tp": 2, "pp_layers": [1, 3], "vit_pp_layers": [2, 0]},
        {"tp": 2, "pp_layers": [[1, 1], [1, 1]], "vit_pp_layers": [[1, 0], [1, 0]]},
    ],
    ids=["tp1", "tp2-pp2", "tp2-vpp"],
)
def test_round_trip_is_bitwise(models: dict[str, Path], tmp_path: Path, kw: dict[str, Any]) -> None:
    convert("hf_to_mm", models["plain"], tmp_path / "mm", **kw)
    report = convert("mm_to_hf", tmp_path / "mm", tmp_path / "hf", hf_dir=str(models["plain"]))
    assert report.status == "converted" and not report.keys_dropped
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json", "generation_config.json", MANIFEST, "model.safetensors"
    ]  # fmt: skip
    assert_same_weights(models["plain"], tmp_path / "hf")


def test_sharded_source_keeps_its_sharding(models: dict[str, Path], tmp_path: Path) -> None:
    src = models["sharded"]
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1
    convert("hf_to_mm", src, tmp_path / "mm", tp=2)
    convert("mm_to_hf", tmp_path / "mm", tmp_path / "hf", hf_dir=str(src))
    assert json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())["weight_map"] == index
    for name in set(index.values()):
        assert set(load_file(tmp_path / "hf" / name)) == {k for k, v in index.items() if v == name}
    assert_same_weights(src, tmp_path / "hf")


# ---------------------------------------------------------------------------------------------------------
# re-runs and refusals


def test_rerun_is_unchanged_and_other_settings_are_refused(models: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "mm"
    assert convert("hf_to_mm", models["plain"], target, tp=2).status == "converted"
    before = {p: p.stat().st_mtime_ns for p in target.rglob("*") if p.is_file()}
    assert convert("hf_to_mm", models["plain"], target, tp=2).status == "unchanged"
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*") if p.is_file()} == before
    with pytest.raises(MMAgentError, match="tp: existing 2 vs requested 1"):
        convert("hf_to_mm", models["plain"], target)


def plan(source: Path, target: Path, **kw: Any) -> None:
    plan_conversion(
        ConvertRequest(converter=QWEN, method="hf_to_mm", source=str(source), target=str(target), **kw)
    )


def test_tp_above_kv_heads_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(
        MMAgentError, match=r"key-value heads \(2\) must be divisible by TP size \(4\)"
    ) as err:
        plan(models["plain"], tmp_path / "mm", tp=4)
    assert err.value.field == "tp" and "--tp 2" in (err.value.fix or "")


@pytest.mark.parametrize(
    ("kw", "field", "match"),
    [
        ({"pp_layers": [1, 2]}, "pp_layers", "sums to 3 layers but the model has 4"),
        ({"pp_layers": [2, 2], "vit_pp_layers": [2]}, "vit_pp_layers", "1x1 .* but pp_layers .* 1x2"),
        (
            {"pp_layers": [2, 2], "vit_pp_layers": [1, 0]},
            "vit_pp_layers",
            "sums to 1 layers but the model has 2",
        ),
    ],
)
def test_bad_splits_are_refused(
    models: dict[str, Path], tmp_path: Path, kw: dict[str, Any], field: str, match: str
) -> None:
    with pytest.raises(MMAgentError, match=match) as err:
        plan(models["plain"], tmp_path / "mm", **kw)
    assert err.value.field == field


def test_unknown_and_missing_keys_are_refused(models: dict[str, Path], tmp_path: Path) -> None:
    state = load_file(models["plain"] / "model.safetensors")
    for name, change in [("extra", {"visual.extra.weight": torch.zeros(1)}), ("missing", {})]:
        broken = tmp_path / name
        broken.mkdir()
        shutil.copy(models["plain"] / "config.json", broken)
        tensors = {**state, **change}
        if not change:
            del tensors["model.layers.2.self_attn.k_proj.weight"]
        save_file(tensors, broken / "model.safetensors")
        match = (
            "does not know: visual.extra.weight"
            if change
            else "model.layers.2.self_attn.k_proj.weight is missing"
        )
        with pytest.raises(MMAgentError, match=match):
            plan(broken, tmp_path / f"{name}-mm")


def test_mm_to_hf_needs_the_original_config(models: dict[str, Path], tmp_path: Path) -> None:
    convert("hf_to_mm", models["plain"], tmp_path / "mm", tp=2)
    with pytest.raises(MMAgentError, match="holds TP=2") as err:
        convert("mm_to_hf", tmp_path / "mm", tmp_path / "hf", tp=4)
    assert err.value.field == "tp"
    (tmp_path / "mm" / MANIFEST).unlink()
    with pytest.raises(MMAgentError, match=r"no config\.json for the export") as err:
        convert("mm_to_hf", tmp_path / "mm", tmp_path / "hf")
    assert err.value.field == "hf_dir"


def test_dry_run_spells_out_the_defaulted_vit_split(models: dict[str, Path], tmp_path: Path) -> None:
    req = ConvertRequest(
        converter=QWEN,
        method="hf_to_mm",
        source=str(models["plain"]),
        target=str(tmp_path / "mm"),
        tp=2,
        pp_layers=[1, 3],
    )
    result = plan_conversion(req)
    argv = result.mm_convert_argv
    assert argv[argv.index("--cfg.parallel_config.vit_pp_layers") + 1] == "[[2,0]]"
    assert [f.path for f in result.layout] == [
        f"release/mp_rank_{t:02d}_{p:03d}/model_optim_rng.pt" for t in range(2) for p in range(2)
    ]
    assert not (tmp_path / "mm").exists()
