"""Tensor side of the VLM converters (torch): build one TP rank's MM tensor, undo it, read rank files.

Building works on the rank's slices of the HF tensors (ops.py), so a merged tensor is never materialised
whole and a TP slice is copied once, into file-backed scratch; renames at TP=1 are the memory-mapped source
itself. Reading maps every rank file (`torch.load(mmap=True)`) and renames the per-stage layer ids back to
global ones from the layer counts the files themselves hold, so mm_to_hf needs no pp_layers argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mm_agent.convert import ops
from mm_agent.convert.layout import LayerKeys, MMCheckpoint, Split
from mm_agent.convert.mapping import Mapping
from mm_agent.convert.schema import KeyChange
from mm_agent.convert.tensors import Scratch, load_pt, own_storage
from mm_agent.convert.vlm import Param, Stages
from mm_agent.errors import MMAgentError


def exact(tensor: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """`tensor` over a storage that is exactly its bytes, so `torch.save` writes only those.

    A contiguous slice (a dim-0 TP shard of a mapped source tensor) gets a storage slice aliasing the
    same pages (zero copy; it keeps the base storage alive); anything strided is copied into scratch.
    """
    if not tensor.is_contiguous():
        return own_storage(tensor, scratch)
    start = tensor.storage_offset() * tensor.element_size()
    storage = tensor.untyped_storage()[start : start + tensor.numel() * tensor.element_size()]
    return torch.empty(0, dtype=tensor.dtype).set_(storage, 0, tensor.shape, tensor.stride())


def build(p: Param, inputs: list[torch.Tensor], rank: int, tp: int, scratch: Scratch) -> torch.Tensor:
    """TP rank `rank`'s MM tensor `p.mm` from its HF tensors (replicated tensors: the whole one)."""
    if p.tp_dim is None:
        rank, tp = 0, 1
    if p.op == "rename":
        return exact(ops.split_tp(inputs[0], tp, p.tp_dim or 0)[rank], scratch)
    rows = sum(t.shape[0] for t in inputs) // tp
    out = scratch.empty((rows, *inputs[0].shape[1:]), inputs[0].dtype)
    if p.op == "merge_qkv":
        q, k, v = inputs
        return ops.merge_qkv(q, k, v, p.args["groups"], out=out, rank=rank, tp=tp)
    if p.op == "relocate_qkv":
        return ops.relocate_qkv(inputs[0], p.args["heads"], out=out, rank=rank, tp=tp)
    gate, up = inputs
    return ops.merge_gate_up(gate, up, out=out, rank=rank, tp=tp)


def unbuild(p: Param, parts: list[torch.Tensor], scratch: Scratch) -> list[torch.Tensor]:
    """The HF tensors of `p` (in `p.hf` order) from its parts on every TP rank (rank 0's when replicated)."""

    def cat(pieces: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
        if len(pieces) == 1:
            return pieces[0] if pieces[0].is_contiguous() else scratch.copy(pieces[0])
        shape = list(pieces[0].shape)
        shape[dim] = sum(t.shape[dim] for t in pieces)
        return ops.merge_tp(pieces, dim, out=scratch.empty(shape, pieces[0].dtype))

    if p.tp_dim is None:
        parts = parts[:1]
    if p.op == "rename":
        return [cat(parts, p.tp_dim or 0)]
    if p.op == "merge_qkv":
        return [cat(x) for x in ops.split_qkv(parts, p.args["groups"], p.args["heads"])]
    if p.op == "relocate_qkv":
        q, k, v = ops.split_qkv(parts, p.args["heads"], p.args["heads"])
        return [cat([*q, *k, *v])]
    return [cat(x) for x in ops.split_gate_up(parts)]


def _state_dicts(obj: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """`model`, or `model0..N` (VPP) of one rank file."""
    if isinstance(obj.get("model"), dict):
        return [obj["model"]]
    chunks: list[dict[str, Any]] = []
    while isinstance(obj.get(f"model{len(chunks)}"), dict):
        chunks.append(obj[f"model{len(chunks)}"])
    if not chunks:
        raise MMAgentError(
            f"holds no 'model' or 'model0..N' state dict (keys: {sorted(obj)[:6]})",
            file=str(path),
            fix="pass a Megatron checkpoint written by mm-convert, mm-agent or a training run",
        )
    return chunks


def read_ranks(
    ckpt: MMCheckpoint, mapping: Mapping
) -> tuple[list[dict[str, torch.Tensor]], Stages, list[KeyChange]]:
    """Every TP rank's tensors under global MM names (views of the mapped files), the split they were
    written with, and the keys dropped by the table's rules (`_extra_state`)."""
    files = [[_state_dicts(load_pt(p), p) for p in ckpt.stage_files(rank)] for rank in range(ckpt.tp)]
    chunks = len(files[0][0])
    if any(len(stage) != chunks for rank in files for stage in rank):
        raise MMAgentError(
            f"{ckpt.root} mixes rank files with different VPP chunk counts",
            field="source",
            fix="re-run the conversion that wrote it",
        )
    splits = {}
    for mod in mapping.modalities:
        keys = LayerKeys(mod.layer_prefix)
        counts = [
            [len({i for i in map(keys.index, st[c]) if i is not None}) for st in files[0]]
            for c in range(chunks)
        ]
        splits[mod.name] = Split(tuple(tuple(row) for row in counts), vpp=chunks > 1)
    llm = next(splits[m.name] for m in mapping.modalities if m.pp_field == "pp_layers")
    dropped: dict[str, KeyChange] = {}
    ranks: list[dict[str, torch.Tensor]] = []
    for rank_files in files:
        merged: dict[str, torch.Tensor] = {}
        for stage, sds in enumerate(rank_files):
            for chunk, sd in enumerate(sds):
                for name, value in sd.items():
                    rule = next((d for d in mapping.drop if d.contains in name), None)
                    if rule is not None:
                        dropped.setdefault(name, KeyChange(source=name, target=None, reason=rule.reason))
                    elif not isinstance(value, torch.Tensor):
                        raise MMAgentError(
                            f"{name} is not a tensor", field="source", fix="pass a weights checkpoint"
                        )
                    else:
                        merged[_global(mapping, splits, name, stage, chunk)] = value
        if ranks and set(merged) != set(ranks[0]):
            odd = sorted(set(merged) ^ set(ranks[0]))
            raise MMAgentError(
                f"TP rank {len(ranks)} holds other tensors than rank 0 ({', '.join(odd[:3])})",
                field="source",
                fix="re-run the conversion that wrote it",
            )
        ranks.append(merged)
    return ranks, Stages(splits, llm), list(dropped.values())


def _global(mapping: Mapping, splits: dict[str, Split], name: str, stage: int, chunk: int) -> str:
    """A layer key's global name: its stage-local id plus the layers before (stage, chunk)."""
    for mod in mapping.modalities:
        index = LayerKeys(mod.layer_prefix).index(name)
        if index is not None:
            return LayerKeys(mod.layer_prefix).renumber(
                name, splits[mod.name].first_layer(chunk, stage) + index
            )
    return name
