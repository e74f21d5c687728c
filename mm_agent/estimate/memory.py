"""Memory per device, itemised: weights, gradients, optimizer states, activations, frozen encoders, workspace.

Mixed precision as Megatron keeps it: bf16 weights (2 bytes), fp32 main gradients (4), fp32 master copy and
Adam m/v (12); on a device that trains in fp32 (the bundled runtime on CPU) 4 + 4 + 8 and 4-byte activations. Sharding divides them over the data parallel ranks (CP ranks included, as Megatron's groups do): the distributed optimizer only the optimizer
states, LayerZero (ZeRO-3) and FSDP2 all three. Weights are split over TP and PP first.

Activations follow Megatron's per-layer formula (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models") with flash attention, so no s^2 score term: attention 11 sbh, two norms 4 sbh,
MLP 3 sbh + 4 sbf (34 sbh for f = 4h); a DiT block adds cross-attention to the text (9 sbh + 4 s_text bh).
With full recompute only every layer's input (2 sbh) is kept, plus one layer's full set during its backward.
Sequence parallelism divides them by TP, Ulysses context parallelism by CP. Pipeline stages hold PP
micro-batches in flight, so the first stage keeps as many layers' activations as the model has.
"""

from __future__ import annotations

from dataclasses import dataclass

from mm_agent.estimate.model import ModelShape, Tower
from mm_agent.estimate.schema import Recompute, Sharding
from mm_agent.estimate.tokens import Tokens

GB = 1024**3
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12
# fp32 training (the bundled runtime on CPU): fp32 weights and gradients, Adam m/v, activations twice bf16's
FP32_BYTES = {"weights": 4, "gradients": 4, "optimizer": 8}
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
    fp32: bool = False  # the device trains in fp32 (devices.yaml precision)

    @property
    def dp(self) -> int:
        return self.npus // (self.tp * self.pp * self.cp)


def lora_params(tower: Tower) -> float:
    """Adapter parameters of rank-16 LoRA on the attention projections (q, k, v, out) and both MLP linears."""
    return tower.layers * LORA_RANK * (4 * 2 * tower.hidden + 2 * (tower.hidden + tower.ffn))


def _layer_bytes(tower: Tower, seq: int, text: int, cross: bool, mbs: int) -> float:
    s, b, h, f = seq, mbs, tower.hidden, tower.ffn
    full = s * b * (18 * h + 4 * f)
    if cross:
        full += 9 * s * b * h + 4 * text * b * h
    return float(full)


def _activations(tower: Tower, seq: int, text: int, cross: bool, lay: Layout) -> float:
    split = lay.tp * lay.cp
    layer = _layer_bytes(tower, seq, text, cross, lay.mbs) / split
    if lay.recompute == "full":
        return tower.layers * 2 * seq * lay.mbs * tower.hidden / split + layer
    return tower.layers * layer


def breakdown(shape: ModelShape, tokens: Tokens, lay: Layout, workspace_gb: float) -> dict[str, float]:
    """GB per device by part; the parts sum to the estimate."""
    towers = [shape.main] + ([shape.vit] if shape.vit else [])
    params = sum(t.params for t in towers)
    trainable = sum(lora_params(t) for t in towers) if lay.lora else params
    model_split = lay.tp * lay.pp
    zero3 = lay.sharding in ("layerzero", "fsdp2")
    shards = lay.dp * lay.cp  # Megatron shards over the data-parallel group with CP ranks included
    dp = shards if zero3 else 1
    opt_dp = shards if lay.sharding != "none" else 1
    wb, gb, ob = (
        (FP32_BYTES["weights"], FP32_BYTES["gradients"], FP32_BYTES["optimizer"])
        if lay.fp32
        else (WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES)
    )
    act = 2 if lay.fp32 else 1  # the activation formula counts 2-byte values
    parts = {
        "weights": wb * params / model_split / dp,
        "gradients": gb * trainable / model_split / dp,
        "optimizer": ob * trainable / model_split / opt_dp,
        "activations": act * _activations(shape.main, tokens.seq, tokens.text, shape.cross_attention, lay),
    }
    if shape.vit is not None:
        parts["vit_activations"] = act * _activations(shape.vit, tokens.vision, 0, False, lay)
    if shape.vocab:
        parts["logits"] = 4.0 * tokens.seq * lay.mbs * shape.vocab / (lay.tp * lay.cp)
    if lay.online_encoders and shape.encoders:
        parts["frozen_encoders"] = WEIGHT_BYTES * shape.encoders
    out = {name: round(value / GB, 2) for name, value in parts.items()}
    out["workspace"] = round(workspace_gb, 2)
    return out
