"""Qwen2.5-VL state dicts between transformers' names and MindSpeed-MM's, in memory (TP 1, PP 1).

The bundled runtime trains transformers' own `Qwen2_5_VLForConditionalGeneration` but reads and writes
checkpoints in MindSpeed-MM's layout, so what it saves is what `pretrain_vlm.py` saves and mm-agent's
`Qwen2_5_VLConverter mm_to_hf` exports it. Both directions use the converter's own table
(`mappings/Qwen2_5_VLConverter.yaml`) and transforms (`ops.py`): one mapping, no second copy of it.
With tied embeddings (the 3B) the MM side has no output layer, as a PP 1 conversion writes it.
"""

from __future__ import annotations

from collections.abc import Mapping as MappingType
from typing import TYPE_CHECKING, Any

from mm_agent.convert import ops
from mm_agent.convert.vlm import Dims, Param, expand, from_canonical, load_table, to_canonical
from mm_agent.errors import MMAgentError

if TYPE_CHECKING:
    import torch

CONVERTER = "Qwen2_5_VLConverter"
LM_HEAD = "lm_head.weight"


def _unknown(unknown: list[str], side: str) -> MMAgentError:
    return MMAgentError(
        f"{len(unknown)} {side} tensor name(s) the {CONVERTER} table does not know: {', '.join(unknown[:4])}",
        file=f"mm_agent/convert/mappings/{CONVERTER}.yaml",
        fix="train a Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration) checkpoint, or add the names to the table",
    )


def _build(p: Param, inputs: list[torch.Tensor]) -> torch.Tensor:
    if p.op == "rename":
        return inputs[0]
    if p.op == "merge_qkv":
        q, k, v = inputs
        return ops.merge_qkv(q, k, v, p.args["groups"])
    if p.op == "relocate_qkv":
        return ops.relocate_qkv(inputs[0], p.args["heads"])
    gate, up = inputs
    return ops.merge_gate_up(gate, up)


def _unbuild(p: Param, tensor: torch.Tensor) -> list[torch.Tensor]:
    import torch

    if p.op == "rename":
        return [tensor]
    if p.op == "merge_qkv":
        return [torch.cat(x) for x in ops.split_qkv([tensor], p.args["groups"], p.args["heads"])]
    if p.op == "relocate_qkv":
        return [ops.unrelocate_qkv([tensor], p.args["heads"])]
    return [torch.cat(x) for x in ops.split_gate_up([tensor])]


def hf_to_mm(state: MappingType[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """MindSpeed-MM's names and fused tensors for a transformers Qwen2.5-VL state dict (`config`: its
    config.json). Renamed tensors are the same objects; fused ones are new."""
    mapping = load_table(CONVERTER)
    dims = Dims.from_config(config)
    actual = {to_canonical(n, mapping): n for n in state if not (dims.tie and n == LM_HEAD)}
    params, unknown = expand(mapping, list(actual), dims, "hf")
    if unknown:
        raise _unknown([actual.get(u, u) for u in unknown], "transformers")  # the names the caller gave
    return {p.mm: _build(p, [state[actual[h]] for h in p.hf]) for p in params}


def mm_to_hf(
    state: MappingType[str, torch.Tensor], config: dict[str, Any], *, newer: bool = True
) -> dict[str, torch.Tensor]:
    """Inverse of `hf_to_mm`: transformers' names (`newer`: transformers >= 4.52's `model.language_model.`)."""
    mapping = load_table(CONVERTER)
    dims = Dims.from_config(config)
    params, unknown = expand(mapping, list(state), dims, "mm")
    if unknown:
        raise _unknown(unknown, "MindSpeed-MM")
    out: dict[str, torch.Tensor] = {}
    for p in params:
        if dims.tie and mapping.tie is not None and p.mm == mapping.tie[0]:
            continue  # an output layer beside tied embeddings: the HF model has none
        for h, t in zip(p.hf, _unbuild(p, state[p.mm]), strict=True):
            out[from_canonical(h, mapping, newer)] = t
    return out
