"""The memory profiles `estimate_resources` budgets with (registry/data/memory_profiles.yaml) against what
they describe: the bundled runtime's figures are re-measured on runtime/wandit.py itself, by counting the
tensors autograd saves for the backward (torch.autograd.graph.saved_tensors_hooks), in fp32 and under bf16
autocast, with and without full recompute; MindSpeed-MM's against the published per-layer formula."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_agent.errors import MMAgentError
from mm_agent.estimate.memory import layer_bytes
from mm_agent.estimate.model import wan_tower
from mm_agent.estimate.profiles import PROFILES_FILE, MemoryProfile, load_profiles, load_profiles_file

torch = pytest.importorskip("torch")

TEXT_DIM = 256


def _predictor(hidden: int, ffn: int, layers: int) -> dict[str, object]:
    return {"model_id": "wandit", "model_type": "t2v", "patch_size": [1, 2, 2], "in_dim": 16, "out_dim": 16,
            "hidden_size": hidden, "num_heads": hidden // 64, "ffn_dim": ffn, "freq_dim": 256,
            "text_dim": TEXT_DIM, "num_layers": layers}  # fmt: skip


def _saved_bytes(hidden: int, ffn: int, layers: int, grid: tuple[int, int, int], text: int, *,
                 bf16: bool, recompute: bool) -> int:  # fmt: skip
    """Bytes of the distinct tensors (parameters aside) one forward of the runtime's Wan DiT saves."""
    from runtime.wandit import WanDiT, WanDiTConfig

    torch.manual_seed(0)
    model = WanDiT(WanDiTConfig.from_predictor(_predictor(hidden, ffn, layers), "pretrain_model.json"))
    model.recompute = recompute
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    t, h, w = grid
    latents = torch.randn(1, 16, t, 2 * h, 2 * w)
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
    ):
        model(latents, torch.tensor([500.0]), torch.randn(1, text, TEXT_DIM))
    return sum(seen.values())


def _linear_params(hidden: int, ffn: int) -> int:
    """Parameters of one block's linears: what autocast copies to bf16."""
    from runtime.wandit import WanDiTBlock, WanDiTConfig

    block = WanDiTBlock(WanDiTConfig.from_predictor(_predictor(hidden, ffn, 1), "pretrain_model.json"))
    return sum(p.numel() for m in block.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters())


def _per_layer(
    hidden: int, ffn: int, grid: tuple[int, int, int], text: int, *, bf16: bool, recompute: bool
) -> float:
    """One block's share: three blocks less one, halved (embeddings and head cancel)."""
    args = (hidden, ffn)
    three = _saved_bytes(*args, 3, grid, text, bf16=bf16, recompute=recompute)
    one = _saved_bytes(*args, 1, grid, text, bf16=bf16, recompute=recompute)
    return (three - one) / 2


SHAPES = [(256, 1024, (5, 6, 6), 64), (384, 768, (9, 8, 8), 128)]  # f = 4h and 2h, two text lengths


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("hidden", "ffn", "grid", "text"), SHAPES)
def test_bundled_profile_is_what_the_runtime_saves(
    precision: str, hidden: int, ffn: int, grid: tuple[int, int, int], text: int
) -> None:
    prof = load_profiles().find("bundled", precision)  # type: ignore[arg-type]
    tower = wan_tower({"hidden_size": hidden, "ffn_dim": ffn, "num_layers": 1, "text_dim": TEXT_DIM,
                       "freq_dim": 256, "in_dim": 16, "out_dim": 16, "patch_size": [1, 2, 2]})  # fmt: skip
    tokens = grid[0] * grid[1] * grid[2]
    measured = _per_layer(hidden, ffn, grid, text, bf16=precision == "bf16", recompute=False)
    casts = prof.cast_weight_bytes * _linear_params(hidden, ffn)
    assert layer_bytes(prof, tower, tokens, text, cross=True, mbs=1) + casts == pytest.approx(
        measured, rel=0.02
    )
    kept = _per_layer(hidden, ffn, grid, text, bf16=precision == "bf16", recompute=True)
    assert prof.kept_per_hidden * tokens * hidden == pytest.approx(kept, rel=0.03)


def test_mindspeed_profile_is_the_published_formula() -> None:
    """Korthikanti et al. 2022 (section 4): 34 sbh per layer with f = 4h and the s^2 term gone with flash
    attention; 2 + 4 + 12 bytes per parameter with Megatron's distributed optimizer's fp32 master copy."""
    prof = load_profiles().find("mindspeed-mm", "bf16")
    assert prof.per_hidden + 4 * prof.per_ffn == 34 and prof.kept_per_hidden == 2
    assert (prof.weight_bytes, prof.grad_bytes, prof.optimizer_bytes) == (2, 4, 12)


def test_profiles_file_is_checked(tmp_path: Path) -> None:
    text = PROFILES_FILE.read_text(encoding="utf-8")
    broken = tmp_path / "memory_profiles.yaml"
    broken.write_text(text.replace("per_ffn: 8 ", "per_ffn: -8 ", 1), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_profiles_file(broken)
    assert "per_ffn" in str(err.value) and err.value.file and "memory_profiles.yaml" in err.value.file
    assert all(isinstance(p, MemoryProfile) and p.source for p in load_profiles_file(PROFILES_FILE).profiles)
    with pytest.raises(MMAgentError, match="no memory profile") as missing:
        load_profiles().find("mindspeed-mm", "fp32")
    assert missing.value.fix
