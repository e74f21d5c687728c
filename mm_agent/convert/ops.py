"""Named tensor transforms of the mapping tables (`op:` in `mappings/*.yaml`), each with its exact inverse.

Megatron fuses tensors that Hugging Face keeps apart (q/k/v, gate/up) and lays them out so that a
contiguous block of rows is one tensor-parallel rank's share. A forward op builds the rows of one TP rank
(`rank`, `tp`; the whole tensor for tp=1) straight from the rank's slices of the HF tensors, which equals
MindSpeed-MM's merge-then-split without materialising the merged tensor; its inverse takes the parts of all
ranks. Slices are views; every concatenation takes `out` (e.g. `tensors.Scratch.empty`) so merged tensors
can live in file-backed memory instead of anonymous memory. Pure renames need no op.
"""

from __future__ import annotations

import torch


def cat_rows(parts: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """Concatenate along dim 0, into `out` when given."""
    return torch.cat(parts, dim=0) if out is None else torch.cat(parts, dim=0, out=out)


def split_tp(tensor: torch.Tensor, tp: int, dim: int) -> list[torch.Tensor]:
    """One view per TP rank along `dim` (0: column-parallel layers, 1: row-parallel layers).

    A size that does not divide is refused: MindSpeed-MM's splitters would silently drop the remainder.
    """
    if tensor.shape[dim] % tp:
        raise ValueError(f"dim {dim} of size {tensor.shape[dim]} does not divide by tp={tp}")
    return list(tensor.chunk(tp, dim=dim))


def merge_tp(parts: list[torch.Tensor], dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of `split_tp`."""
    return torch.cat(parts, dim=dim) if out is None else torch.cat(parts, dim=dim, out=out)


def merge_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    groups: int,
    out: torch.Tensor | None = None,
    rank: int = 0,
    tp: int = 1,
) -> torch.Tensor:
    """Megatron's fused `linear_qkv`: for each key-value group g the rows [q heads of g; k_g; v_g].

    HF keeps q/k/v separate and head-major; Megatron interleaves them by KV group (MindSpeed-MM
    QKVMergeOp) so that TP rank r's contiguous rows are whole groups: the merge of r's slices of q, k, v.
    Weights and biases alike (dim 0).
    """
    q, k, v = (split_tp(t, tp, 0)[rank] for t in (q, k, v))
    trios = zip(q.chunk(groups // tp), k.chunk(groups // tp), v.chunk(groups // tp), strict=True)
    return cat_rows([t for trio in trios for t in trio], out)


def split_qkv(
    parts: list[torch.Tensor], groups: int, heads: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Inverse of `merge_qkv` over the parts of all TP ranks: (q pieces, k pieces, v pieces) as row
    views in order, each to be concatenated once.

    A group holds heads/groups query heads plus one key and one value head, which gives the head size
    from the rows alone.
    """
    local = groups // len(parts)
    q: list[torch.Tensor] = []
    k: list[torch.Tensor] = []
    v: list[torch.Tensor] = []
    for part in parts:
        per_group = part.shape[0] // local
        head_dim = per_group // (heads // groups + 2)
        for group in part.chunk(local):
            gq, gk, gv = group.split([per_group - 2 * head_dim, head_dim, head_dim])
            q.append(gq)
            k.append(gk)
            v.append(gv)
    return q, k, v


def relocate_qkv(
    qkv: torch.Tensor, heads: int, out: torch.Tensor | None = None, rank: int = 0, tp: int = 1
) -> torch.Tensor:
    """HF's fused ViT `attn.qkv` rows [q; k; v] -> Megatron's per-head [q_h; k_h; v_h] (RelocateOp).

    The ViT has no GQA, so this is `merge_qkv` with one group per head.
    """
    q, k, v = qkv.chunk(3)
    return merge_qkv(q, k, v, heads, out, rank, tp)


def unrelocate_qkv(parts: list[torch.Tensor], heads: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of `relocate_qkv` over the parts of all TP ranks."""
    q, k, v = split_qkv(parts, heads, heads)
    return cat_rows([*q, *k, *v], out)


def merge_gate_up(
    gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None, rank: int = 0, tp: int = 1
) -> torch.Tensor:
    """Megatron's gated-MLP `linear_fc1`: rows [gate; up] (UpGateMergeOp); TP rank r holds
    [gate_r; up_r] (GLUSplit)."""
    return cat_rows([split_tp(gate, tp, 0)[rank], split_tp(up, tp, 0)[rank]], out)


def split_gate_up(parts: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inverse of `merge_gate_up` over the parts of all TP ranks: (gate pieces, up pieces) row views."""
    halves = [part.chunk(2) for part in parts]
    return [h[0] for h in halves], [h[1] for h in halves]
