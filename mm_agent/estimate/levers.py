"""The changes that lower the memory per device, each re-estimated; best first.

Best = fits first, then the least intrusive change: recompute, context parallelism, sharding, more devices
(these keep the training the same), then LoRA (trains an adapter instead), then fewer frames and a lower
resolution (change the data). Only changes that lower the estimate are listed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.estimate.schema import FULL_SHARDING, EstimateRequest, EstimateResult, Lever

SHARD_NPUS = 8  # one node: where sharding over data parallel ranks starts to pay


def _candidates(req: EstimateRequest, cur: EstimateResult) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if cur.recompute == "none":
        out.append(("full activation recompute (--recompute full)", {"recompute": "full"}))
    for cp in (2, 4):  # Ulysses CP: MindSpeed-MM's Megatron jobs
        if "megatron" in cur.backend and cur.cp < cp and cur.npus % (cur.tp * cur.pp * cp) == 0:
            out.append((f"context parallel {cp} (Ulysses; --cp {cp})", {"cp": cp}))
    if cur.sharding not in FULL_SHARDING:
        name = "fsdp2" if "fsdp2" in cur.backend else "zero3" if "deepspeed" in cur.backend else "layerzero"
        npus = max(cur.npus, SHARD_NPUS)
        on = "" if npus == cur.npus else f" on {npus} NPUs"
        out.append(
            (
                f"shard weights, gradients and optimizer over DP ({name}, ZeRO-3){on}",
                {"sharding": name, "npus": npus},
            )
        )
    else:
        out.append((f"twice the NPUs ({cur.npus * 2})", {"npus": cur.npus * 2}))
    if not cur.lora:
        out.append(("LoRA (adapter-only gradients and optimizer states)", {"lora": True}))
    if cur.frames > 17:
        fewer = (cur.frames - 1) // 2 // 4 * 4 + 1
        out.append((f"fewer frames ({cur.frames} -> {fewer})", {"frames": fewer}))
    h, w = cur.height * 3 // 4 // 16 * 16, cur.width * 3 // 4 // 16 * 16
    out.append((f"lower resolution ({cur.height}x{cur.width} -> {h}x{w})", {"height": h, "width": w}))
    return out


def rank_levers(
    req: EstimateRequest, cur: EstimateResult, estimate: Callable[[EstimateRequest], EstimateResult]
) -> list[Lever]:
    levers: list[tuple[int, Lever]] = []
    for order, (change, args) in enumerate(_candidates(req, cur)):
        try:
            new = estimate(req.model_copy(update=args))
        except MMAgentError:
            continue  # a change this model cannot take (e.g. a resolution its VAE refuses)
        if new.per_device_gb < cur.per_device_gb - 0.05:
            levers.append(
                (order, Lever(change=change, per_device_gb=new.per_device_gb, fits=new.fits, args=args))
            )
    levers.sort(key=lambda item: (not item[1].fits, item[0] if item[1].fits else item[1].per_device_gb))
    return [lever for _, lever in levers]
