"""Memory per device, itemised: weights, gradients, optimizer states, activations, frozen encoders, workspace.

The bytes come from the runtime's memory profile (`registry/data/memory_profiles.yaml`, `profiles.py`):
MindSpeed-MM keeps bf16 weights, fp32 main gradients and an fp32 master copy with Adam m/v (2 + 4 + 12 bytes
per parameter) and Megatron's per-layer activations with flash attention (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models": no s^2 score term); the bundled runtime keeps fp32
state (4 + 4 + 8) and the activations measured from its own blocks; under bf16 autocast it also keeps a bf16
copy of every weight through the forward. A DiT block adds cross-attention to
the text. With full recompute only every layer's input is kept, plus one layer's full set during its
backward. Sharding divides the state over the data parallel ranks (CP ranks included, as Megatron's groups
do): the distributed optimizer only the optimizer states, DeepSpeed ZeRO-2 also the gradients, ZeRO-3,
LayerZero and FSDP2 all three. Weights
are split over TP and PP first. Sequence parallelism divides activations by TP, Ulysses context parallelism
by CP. Pipeline stages hold PP micro-batches in flight, so the first stage keeps as many layers'
activations as the model has.
"""

from __future__ import annotations

from dataclasses import dataclass

from mm_agent.estimate.model import ModelShape, Tower
from mm_agent.estimate.profiles import MemoryProfile
from mm_agent.estimate.schema import FULL_SHARDING, Recompute, Sharding
from mm_agent.estimate.tokens import Tokens

GB = 1024**3
ENCODER_BYTES = 2  # frozen encoders loaded for online encoding are bf16
LORA_RANK = 16


@dataclass(frozen=True)
class Layout:
    npus: int
    tp: int
    pp: int
    cp: int
    mbs: int
    recompute: Recompute
    sharding: Sharding
    lora: bool
    online_encoders: bool
    profile: MemoryProfile  # the runtime's bytes per parameter and per token

    @property
    def dp(self) -> int:
        return self.npus // (self.tp * self.pp * self.cp)


def lora_params(tower: Tower) -> float:
    """Adapter parameters of rank-16 LoRA on the attention projections (q, k, v, out) and both MLP linears."""
    return tower.layers * LORA_RANK * (4 * 2 * tower.hidden + 2 * (tower.hidden + tower.ffn))


def layer_bytes(prof: MemoryProfile, tower: Tower, seq: int, text: int, cross: bool, mbs: int) -> float:
    """Activation bytes one layer keeps for its backward (the profile's per-token coefficients)."""
    s, b, h, f = seq, mbs, tower.hidden, tower.ffn
    full = s * b * (prof.per_hidden * h + prof.per_ffn * f)
    if cross:
        full += prof.cross_per_hidden * s * b * h + prof.per_text_hidden * text * b * h
    return float(full)


def _activations(tower: Tower, seq: int, text: int, cross: bool, lay: Layout) -> float:
    split = lay.tp * lay.cp
    layer = layer_bytes(lay.profile, tower, seq, text, cross, lay.mbs) / split
    if lay.recompute == "full":
        return tower.layers * lay.profile.kept_per_hidden * seq * lay.mbs * tower.hidden / split + layer
    return tower.layers * layer


def breakdown(shape: ModelShape, tokens: Tokens, lay: Layout, workspace_gb: float) -> dict[str, float]:
    """GB per device by part; the parts sum to the estimate."""
    towers = [shape.main] + ([shape.vit] if shape.vit else [])
    params = sum(t.params for t in towers)
    trainable = sum(lora_params(t) for t in towers) if lay.lora else params
    model_split = lay.tp * lay.pp
    shards = lay.dp * lay.cp  # Megatron shards over the data-parallel group with CP ranks included
    dp = shards if lay.sharding in FULL_SHARDING else 1
    grad_dp = shards if lay.sharding in ("zero2", *FULL_SHARDING) else 1
    opt_dp = shards if lay.sharding != "none" else 1
    prof = lay.profile
    parts = {
        "weights": prof.weight_bytes * params / model_split / dp,
        "gradients": prof.grad_bytes * trainable / model_split / grad_dp,
        "optimizer": prof.optimizer_bytes * trainable / model_split / opt_dp,
        "activations": _activations(shape.main, tokens.seq, tokens.text, shape.cross_attention, lay),
    }
    if prof.cast_weight_bytes:  # autocast's cache holds every layer's copy until the forward ends
        parts["weight_casts"] = prof.cast_weight_bytes * params / model_split
    if shape.vit is not None:
        parts["vit_activations"] = _activations(shape.vit, tokens.vision, 0, False, lay)
    if shape.vocab:
        parts["logits"] = 4.0 * tokens.seq * lay.mbs * shape.vocab / (lay.tp * lay.cp)
    if lay.online_encoders and shape.encoders:
        parts["frozen_encoders"] = ENCODER_BYTES * shape.encoders
    out = {name: round(value / GB, 2) for name, value in parts.items()}
    out["workspace"] = round(workspace_gb, 2)
    return out
