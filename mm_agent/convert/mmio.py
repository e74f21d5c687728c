"""Reading and writing Megatron rank files (torch), one file at a time, tensors memory-mapped.

Reading merges a PP/VPP checkpoint back into one global state dict whose tensors are views of the mapped
rank files (nothing is copied); writing saves one rank file, then lets its references go, so at most one
file's worth of pickling bookkeeping is alive. The placement itself comes from `native.place`.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from mm_agent.convert.layout import CHECKPOINT_VERSION, LayerKeys, MMCheckpoint, Split
from mm_agent.convert.ptfile import save_pt
from mm_agent.convert.tensors import Scratch, load_pt, own_storage
from mm_agent.errors import MMAgentError

_MODEL_KEY = re.compile(r"^model(\d+)$")


def _chunks(obj: dict[str, object], path: Path) -> tuple[list[dict[str, torch.Tensor]], bool]:
    """State dicts of one rank file in chunk order, and whether it is a VPP file."""
    if isinstance(obj.get("model"), dict):
        return [_tensors(obj["model"], path)], False  # type: ignore[arg-type]
    numbered = sorted((int(m.group(1)), k) for k in obj if (m := _MODEL_KEY.match(k)))
    if not numbered or [n for n, _ in numbered] != list(range(len(numbered))):
        raise MMAgentError(
            f"holds no 'model' or 'model0..N' state dicts (keys: {sorted(obj)[:6]})",
            file=str(path),
            fix="pass a Megatron checkpoint written by mm-convert, mm-agent or a training run",
        )
    return [_tensors(obj[k], path) for _, k in numbered], True  # type: ignore[arg-type]


def _tensors(sd: dict[str, object], path: Path) -> dict[str, torch.Tensor]:
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor) and not k.endswith("_extra_state")]
    if bad:
        raise MMAgentError(
            f"state dict entries that are not tensors: {bad[:5]}",
            file=str(path),
            fix="pass a weights checkpoint",
        )
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def load_merged(
    ckpt: MMCheckpoint, layer_prefix: str, tp_rank: int = 0
) -> tuple[dict[str, torch.Tensor], Split]:
    """One TP rank's stages merged into global names (layers renumbered chunk-major), and the source split."""
    keys = LayerKeys(layer_prefix)
    per_stage = []
    vpp_flags = set()
    for path in ckpt.stage_files(tp_rank):
        chunks, vpp = _chunks(load_pt(path), path)
        per_stage.append(chunks)
        vpp_flags.add(vpp)
    if len(vpp_flags) != 1 or len({len(c) for c in per_stage}) != 1:
        raise MMAgentError(
            f"{ckpt.root} mixes VPP and non-VPP rank files or chunk counts",
            field="source",
            fix="re-run the conversion that wrote it",
        )
    counts = []
    for chunk in range(len(per_stage[0])):
        row = []
        for stage, chunks in enumerate(per_stage):
            ids = {i for i in (keys.index(k) for k in chunks[chunk]) if i is not None}
            if ids != set(range(len(ids))):
                raise MMAgentError(
                    f"stage {stage} chunk {chunk} has layer ids {sorted(ids)[:8]}, not 0..N-1",
                    field="source",
                    fix="the checkpoint is not in MindSpeed-MM's layout (layers renumbered from 0 per stage)",
                )
            row.append(len(ids))
        counts.append(tuple(row))
    split = Split(tuple(counts), vpp=vpp_flags.pop())
    merged: dict[str, torch.Tensor] = {}
    # chunk-major, as MindSpeed-MM's _pp_vpp_merge reads them: the merged order (and so a resplit's rank
    # files) lists tensors as its converters do
    for chunk in range(len(per_stage[0])):
        for stage, chunks in enumerate(per_stage):
            first = split.first_layer(chunk, stage)
            for name, tensor in chunks[chunk].items():
                layer = keys.index(name)
                glob = name if layer is None else keys.renumber(name, first + layer)
                if glob in merged:
                    raise MMAgentError(
                        f"{glob!r} appears on more than one stage",
                        field="source",
                        fix="re-run the conversion",
                    )
                merged[glob] = tensor
    return merged, split


def save_stage(path: Path, chunks: list[dict[str, torch.Tensor]], vpp: bool, scratch: Scratch) -> int:
    """Write one rank file (`{"model": sd}` or `{"model0": ..., "checkpoint_version": 3.0}`); its size."""
    own = [{k: own_storage(v, scratch) for k, v in sd.items()} for sd in chunks]
    obj: dict[str, object] = {f"model{i}": sd for i, sd in enumerate(own)} if vpp else {"model": own[0]}
    if vpp:
        obj["checkpoint_version"] = CHECKPOINT_VERSION
    return save_pt(path, obj)
