"""`--verify`: the numeric proof passes on exact conversions and names the tensor when one is wrong.

Tiny diffusers `WanTransformer3DModel`s (t2v, i2v, flf2v) and a tiny transformers Qwen2.5-VL are built from
configs and saved with `save_pretrained`; conversions run through the real engine (`execute`).
"""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("accelerate")

from mm_agent.convert import verify  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.plan import BASE_PEAK_BYTES  # noqa: E402
from mm_agent.convert.schema import ConvertReport, ConvertRequest  # noqa: E402
from mm_agent.errors import MMAgentError  # noqa: E402

WAN_KINDS: dict[str, dict[str, Any]] = {
    "t2v": {},
    "i2v": {"image_dim": 24, "added_kv_proj_dim": 32},
    "flf2v": {"image_dim": 24, "added_kv_proj_dim": 32, "pos_embed_seq_len": 8},
}


def save_wan(path: Path, kind: str, seed: int = 0) -> Path:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=3,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        **WAN_KINDS[kind],
    )
    with torch.no_grad():  # diffusers zero-initialises some weights; make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(path)
    return path


def convert(**kwargs: Any) -> ConvertReport:
    return execute(ConvertRequest(converter="WanConverter", confirm=True, **kwargs))


@pytest.mark.parametrize("kind", sorted(WAN_KINDS))
def test_wan_hf_to_mm_verifies_exactly(tmp_path: Path, kind: str) -> None:
    hf = save_wan(tmp_path / "hf", kind)
    report = convert(
        method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm"), pp_layers=[1, 2], verify=True
    )
    v = report.verify
    assert v is not None, report.message
    assert v.ok, v.details
    assert v.round_trip_bitwise is True
    assert v.max_abs_diff == 0.0
    assert v.dtype == "float32"
    assert any("0 mismatch" in d for d in v.details)
    assert not list(tmp_path.glob(".mm-agent-verify-*")), "the round-trip dir is removed"


def test_wan_in_place_vpp_and_mm_to_hf_and_resplit_verify(tmp_path: Path) -> None:
    hf = save_wan(tmp_path / "transformer", "i2v")
    first = convert(
        method="hf_to_mm", source=str(hf), target=str(hf), pp_layers=[[1, 0], [1, 1]], verify=True
    )
    assert first.verify is not None and first.verify.ok, first.verify
    export = convert(
        method="mm_to_hf", source=str(hf), target=str(tmp_path / "export"), hf_dir=str(hf), verify=True
    )
    assert export.verify is not None and export.verify.ok and export.verify.max_abs_diff == 0.0, export.verify
    resplit = convert(
        method="resplit", source=str(hf), target=str(tmp_path / "pp3"), pp_layers=[1, 1, 1], verify=True
    )
    assert resplit.verify is not None and resplit.verify.ok and resplit.verify.round_trip_bitwise, (
        resplit.verify
    )


def corrupt(rank_file: Path, mm_name: str) -> None:
    """Flip the sign of one element of one tensor in a rank file, as a bad copy or a bug would."""
    obj = torch.load(rank_file, map_location="cpu", weights_only=True)
    tensor = obj["model"][mm_name]
    tensor.view(-1)[0] = -tensor.view(-1)[0] - 1.0
    torch.save(obj, rank_file)


def test_corrupted_rank_file_fails_verification_naming_the_key(tmp_path: Path) -> None:
    hf = save_wan(tmp_path / "hf", "t2v")
    req = ConvertRequest(
        converter="WanConverter",
        method="hf_to_mm",
        source=str(hf),
        target=str(tmp_path / "mm"),
        pp_layers=[2, 1],
    )
    report = execute(req.model_copy(update={"confirm": True}))
    assert report.verify is None
    # stage 1 holds global block 2 renumbered to 0
    corrupt(tmp_path / "mm/release/mp_rank_00_001/model_optim_rng.pt", "blocks.0.self_attn.proj_q.weight")
    v = verify.verify_conversion(req, report)
    assert not v.ok
    assert v.round_trip_bitwise is False
    assert v.max_abs_diff is not None and v.max_abs_diff > 0
    bad = [d for d in v.details if "values differ" in d]
    assert len(bad) == 1 and "blocks.2.attn1.to_q.weight" in bad[0], v.details


def test_wan_mm_to_hf_names_the_rank_file_key(tmp_path: Path) -> None:
    """mm_to_hf's round trip compares rank files, so the mismatch names the file and the MM key."""
    hf = save_wan(tmp_path / "hf", "t2v")
    convert(method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm"))
    req = ConvertRequest(
        converter="WanConverter", method="mm_to_hf", source=str(tmp_path / "mm"), target=str(tmp_path / "out"),
        hf_dir=str(hf),
    )  # fmt: skip
    report = execute(req.model_copy(update={"confirm": True}))
    export = tmp_path / "out" / "diffusion_pytorch_model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(export)
    tensors["proj_out.bias"] = tensors["proj_out.bias"] + 1.0
    save_file(tensors, export, metadata={"format": "pt"})
    v = verify.verify_conversion(req, report)
    assert not v.ok and v.round_trip_bitwise is False
    assert any(
        "release/mp_rank_00/model_optim_rng.pt[model] head.head.bias: values differ" in d for d in v.details
    )


def test_refused_with_a_clear_message_when_memory_is_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = save_wan(tmp_path / "hf", "t2v")
    req = ConvertRequest(
        converter="WanConverter", method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm")
    )
    report = execute(req.model_copy(update={"confirm": True}))
    from safetensors.torch import load_file

    need = verify.forward_bytes(req)
    numel = sum(t.numel() for t in load_file(hf / "diffusion_pytorch_model.safetensors").values())
    assert need == 4 * numel + verify.OVERHEAD_BYTES  # one fp32 copy of the model at a time
    memory = namedtuple("memory", "available")
    monkeypatch.setattr(verify.psutil, "virtual_memory", lambda: memory(need - 1))
    with pytest.raises(MMAgentError, match="verification builds the model in fp32"):
        verify.require_fit(req)
    v = verify.verify_conversion(req, report)
    assert not v.ok and v.round_trip_bitwise is None
    assert "not verified" in v.details[0] and "--verify" in v.details[0]


def test_engine_refuses_verify_before_converting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = save_wan(tmp_path / "hf", "t2v")
    memory = namedtuple("memory", "available")
    # enough for the streaming conversion (plan.BASE_PEAK_BYTES), not for an fp32 model + runtime
    monkeypatch.setattr(verify.psutil, "virtual_memory", lambda: memory(BASE_PEAK_BYTES + 1))
    with pytest.raises(MMAgentError, match="without --verify"):
        convert(method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm"), verify=True)
    assert not (tmp_path / "mm").exists()


# ---------------------------------------------------------------------------------------------------------
# Qwen2.5-VL


def save_qwen(path: Path, tie: bool = False, image_tokens: bool = True) -> Path:
    """LLM: 2 layers, hidden 64, 4 heads, 2 KV heads; ViT: depth 2, hidden 32, 2 heads; vocab 128 with the
    image/vision token ids inside it (so the forward check can feed an image) unless `image_tokens` is off."""
    transformers = pytest.importorskip("transformers")
    ids = {
        "image_token_id": 120,
        "video_token_id": 121,
        "vision_start_token_id": 122,
        "vision_end_token_id": 123,
    }
    config = transformers.Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}, "tie_word_embeddings": tie,
            "bos_token_id": 1, "eos_token_id": 2,
        },
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64},
        tie_word_embeddings=tie,
        **(ids if image_tokens else {}),
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    return path


def qwen(**kwargs: Any) -> ConvertReport:
    return execute(ConvertRequest(converter="Qwen2_5_VLConverter", confirm=True, **kwargs))


def test_qwen_hf_to_mm_tp2_pp2_verifies_exactly_with_an_image(tmp_path: Path) -> None:
    hf = save_qwen(tmp_path / "hf")
    report = qwen(
        method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm"), tp=2,
        pp_layers=[1, 1], vit_pp_layers=[2, 0], verify=True,
    )  # fmt: skip
    v = report.verify
    assert v is not None and v.ok, v
    assert v.round_trip_bitwise is True and v.max_abs_diff == 0.0
    assert any("one image" in d for d in v.details), v.details


def test_qwen_tied_mm_to_hf_verifies_by_round_trip(tmp_path: Path) -> None:
    hf = save_qwen(tmp_path / "hf", tie=True, image_tokens=False)
    first = qwen(method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm"), tp=2, verify=True)
    assert first.verify is not None and first.verify.ok and first.verify.max_abs_diff == 0.0, first.verify
    assert any("text tokens (image token ids are outside" in d for d in first.verify.details)
    export = qwen(
        method="mm_to_hf",
        source=str(tmp_path / "mm"),
        target=str(tmp_path / "out"),
        hf_dir=str(hf),
        verify=True,
    )
    v = export.verify
    assert v is not None and v.ok and v.round_trip_bitwise is True, v
    assert v.max_abs_diff is None  # Megatron's model is not built here; the bitwise round trip proves it


def test_qwen_corrupted_tp_rank_fails_naming_the_hf_tensor(tmp_path: Path) -> None:
    hf = save_qwen(tmp_path / "hf")
    req = ConvertRequest(
        converter="Qwen2_5_VLConverter", method="hf_to_mm", source=str(hf), target=str(tmp_path / "mm"), tp=2
    )
    report = execute(req.model_copy(update={"confirm": True}))
    # rank 1's fused QKV starts with the first query row of KV group 1
    path = tmp_path / "mm/release/mp_rank_01/model_optim_rng.pt"
    obj = torch.load(path, map_location="cpu", weights_only=True)
    qkv = obj["model"]["text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"]
    qkv[0, 0] = -qkv[0, 0] - 1.0
    torch.save(obj, path)
    v = verify.verify_conversion(req, report)
    assert not v.ok and v.round_trip_bitwise is False
    assert v.max_abs_diff is not None and v.max_abs_diff > 0
    bad = [d for d in v.details if "values differ" in d]
    assert len(bad) == 1 and "model.layers.0.self_attn.q_proj.weight" in bad[0], v.details
