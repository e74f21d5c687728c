"""FLOPs per step and the time it takes: 6 N tokens for the dense part (forward 2, backward 4; LoRA skips the
frozen weights' gradients: 4), plus attention's 12 L s^2 h for forward and backward (cross-attention:
12 L s s_text h), x 4/3 with full recompute (the forward runs twice), over the device peak x MFU."""

from __future__ import annotations

from mm_agent.estimate.memory import Layout
from mm_agent.estimate.model import ModelShape, Tower
from mm_agent.estimate.tokens import Tokens


def _tower_flops(tower: Tower, seq: int, text: int, lora: bool) -> float:
    dense = (4 if lora else 6) * tower.active * seq
    attention = 12 * tower.layers * seq * seq * tower.hidden
    cross = 12 * tower.layers * seq * text * tower.hidden if text else 0
    return float(dense + attention + cross)


def flops_per_sample(shape: ModelShape, tokens: Tokens, lay: Layout) -> float:
    text = tokens.text if shape.cross_attention else 0
    total = _tower_flops(shape.main, tokens.seq, text, lay.lora)
    if shape.vit is not None:
        total += _tower_flops(shape.vit, tokens.vision, 0, lay.lora)
    return total * (4 / 3 if lay.recompute == "full" else 1)


def step_seconds(step_flops: float, npus: int, peak_tflops: float, mfu: float) -> float:
    return step_flops / (npus * peak_tflops * 1e12 * mfu)
