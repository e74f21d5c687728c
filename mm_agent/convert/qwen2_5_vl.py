"""Qwen2_5_VLConverter natively: hf_to_mm and mm_to_hf (MindSpeed-MM semantics, streaming, atomic).

The mapping is data (`mappings/Qwen2_5_VLConverter.yaml`, expanded by `vlm`). hf_to_mm writes one rank file
at a time; renamed tensors come straight from the memory-mapped safetensors, merged ones (QKV by KV group,
ViT QKV per head, gate/up) and TP slices are built for that rank only, in file-backed scratch (`vlm_io`).
The layout is upstream `save_by_vpp`'s: `{"model" | "model<i>": sd, "checkpoint_version": 3.0}` with ViT
and LLM split by their own pp_layers. mm_to_hf maps every rank file, undoes the transforms per HF tensor and
writes safetensors in the naming (hub or newer transformers) and sharding of the original checkpoint.
torch is imported only inside the methods that convert (`plan` runs in the MCP server).
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_agent.convert.atomic import Staging, pause_for_tests
from mm_agent.convert.layout import CHECKPOINT_VERSION, RELEASE, TRACKER, find_checkpoint
from mm_agent.convert.manifest import MANIFEST, hash_sources, read_manifest, write_manifest
from mm_agent.convert.native import CONFIG, Record, index_file, read_hf_source, read_json, same_dir, unchanged
from mm_agent.convert.plan import NativeLayout
from mm_agent.convert.schema import ConvertPlan, ConvertReport, ConvertRequest, KeyChange, Manifest, RankFile
from mm_agent.convert.shapes import check_shapes
from mm_agent.convert.vlm import (
    Dims,
    Param,
    check_dims,
    check_heads,
    expand,
    from_canonical,
    layout_files,
    load_table,
    parse_stages,
    place,
    to_canonical,
    upstream_order,
    uses_newer_names,
)
from mm_agent.errors import MMAgentError

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from mm_agent.convert.tensors import Scratch

    Progress = Callable[[int, int, str], None]

CONVERTER = "Qwen2_5_VLConverter"
HF_INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 1000**3  # transformers' classic max_shard_size ("5GB"); hub Qwen shards are ~4 GB
TIED = "tied to embed_tokens (tie_word_embeddings): the HF model has no separate lm_head"


def _unknown(unknown: list[str], what: str) -> MMAgentError:
    return MMAgentError(
        f"{len(unknown)} key(s) the {CONVERTER} table does not know: {', '.join(unknown[:4])}",
        field="source",
        fix=f"pass {what}, or add the keys to mm_agent/convert/mappings/{CONVERTER}.yaml",
    )


# ---------------------------------------------------------------------------------------------------------
# hf_to_mm


class _HFPlan:
    """Everything hf_to_mm decides from the safetensors headers: tensors, splits, placement, files."""

    def __init__(self, req: ConvertRequest):
        self.req = req
        self.mapping = mapping = load_table(CONVERTER)
        self.source = src = read_hf_source(Path(req.source))
        if src.config is None:
            raise MMAgentError(
                f"No config.json in {src.root}", field="source", fix="pass the HF Qwen2.5-VL dir"
            )
        self.dims = Dims.from_config(src.config)
        uses_newer_names(list(src.where), mapping)
        self.actual = {to_canonical(n, mapping): n for n in src.where}
        check_shapes(  # merged or renamed, a transposed or reshaped input would be converted as it is
            mapping.shapes,
            {c: src.where[a][1].shape for c, a in self.actual.items()},
            self.dims.values,
            {c: str(src.where[a][0].path) for c, a in self.actual.items()},
            shown=self.actual,
        )
        check_heads(mapping, self.dims, req.tp)
        params, unknown = expand(mapping, list(self.actual), self.dims, "hf")
        if unknown:
            raise _unknown(unknown, "a Qwen2.5-VL checkpoint (Qwen2_5_VLForConditionalGeneration)")
        params = upstream_order(mapping, params, list(self.actual))
        self.stages = parse_stages(mapping, self.dims, req.pp_layers, req.vit_pp_layers)
        self.params, self.dropped = self._tie(params)
        check_dims(self.params, {c: src.where[a][1].shape for c, a in self.actual.items()}, req.tp)
        self.placement = {p.mm: place(mapping, self.stages, p.mm) for p in self.params}
        sizes = {
            p.mm: (sum(src.where[self.actual[h]][1].nbytes for h in p.hf), p.tp_dim) for p in self.params
        }
        self.files = layout_files(mapping, self.stages, sizes, req.tp)

    def _tie(self, params: list[Param]) -> tuple[list[Param], list[KeyChange]]:
        """Upstream TieOp: with tied embeddings and PP > 1 the last stage gets the embedding as its output
        layer (it cannot reach the first stage's copy); at PP = 1 Megatron shares the one tensor. Like
        TieOp's assignment, it takes the place of an output layer the checkpoint has, else comes last."""
        if self.mapping.tie is None or not self.dims.tie or self.stages.pp == 1:
            return params, []
        output, embedding = self.mapping.tie
        emb = next(p for p in params if p.mm == embedding)
        tied = Param(output, emb.hf, "rename", {}, emb.tp_dim)
        dropped = [
            KeyChange(source=self.actual[h], target=None, reason=TIED)
            for p in params
            if p.mm == output
            for h in p.hf
        ]
        if dropped:
            return [tied if p.mm == output else p for p in params], dropped
        return [*params, tied], dropped

    def record(self) -> Record:
        src, stages = self.source, self.stages
        vit = stages.of_field(self.mapping, "vit_pp_layers")
        return Record(
            req=self.req.model_copy(update={"vit_pp_layers": vit.pp_layers if vit else None}),
            direction="hf_to_mm",
            pp_layers=stages.llm.pp_layers,
            vpp=stages.chunks,
            key_count=len(self.params),
            files=self.files,
            source_root=src.root,
            source_files=src.files(),
            hf={"hf_config": src.config, "hf_index": src.index_name, "hf_weight_map": src.weight_map},
        )

    def report(
        self,
        status: str,
        plan: ConvertPlan,
        message: str,
        written: int = 0,
        warnings: list[str] | None = None,
    ) -> ConvertReport:
        return ConvertReport(
            status=status,  # type: ignore[arg-type]
            plan=plan,
            message=message,
            keys_converted=len(self.params),
            keys_dropped=self.dropped,
            files=self.files,
            bytes_written=written,
            warnings=warnings or [],
        )


def _plan_hf_to_mm(req: ConvertRequest) -> NativeLayout:
    hp = _HFPlan(req)
    merged = sum(1 for p in hp.params if p.op != "rename")
    splits = ", ".join(f"{m.pp_field}={hp.stages.splits[m.name].pp_layers}" for m in hp.mapping.modalities)
    notes = [
        f"{len(hp.params)} MM tensors ({merged} merged: QKV by KV group, ViT QKV, gate/up); TP={req.tp}, {splits}"
    ]
    notes += hp.stages.notes + [f"{c.source} dropped: {c.reason}" for c in hp.dropped]
    return NativeLayout(
        files=hp.files,
        source_bytes=hp.source.nbytes,
        output_bytes=sum(f.bytes for f in hp.files),
        scratch_bytes=max(f.bytes for f in hp.files),
        notes=notes,
        resolved={m.pp_field: hp.stages.splits[m.name].pp_layers for m in hp.mapping.modalities},
    )


def hf_to_mm(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert.ptfile import save_pt
    from mm_agent.convert.tensors import NonFinite, SafetensorsFile, Scratch
    from mm_agent.convert.vlm_io import build

    hp = _HFPlan(req)
    record = hp.record()
    target = Path(req.target)
    if unchanged(target, TRACKER, record) is not None:
        return hp.report("unchanged", plan, f"{target} already holds this conversion; nothing to do")
    readers = {h.path: SafetensorsFile(h.path, h) for h in hp.source.headers}
    finite = NonFinite()  # the HF inputs, by the names in the user's files (once each, whatever the TP)

    def hf_tensor(name: str) -> torch.Tensor:
        actual = hp.actual[name]
        return finite.check(actual, readers[hp.source.where[actual][0].path].get(actual))

    keys = hp.stages.model_keys()
    written = 0
    with ThreadPoolExecutor(1) as pool, Staging(target) as staging:
        hashes = pool.submit(hash_sources, record.source_root, record.source_files)
        scratch = Scratch(staging.scratch_dir)
        for i, entry in enumerate(hp.files, 1):
            obj: dict[str, Any] = {key: {} for key in keys}
            for p in hp.params:
                stage, chunk, local = hp.placement[p.mm]
                if stage == (entry.pp_rank or 0):
                    inputs = [hf_tensor(h) for h in p.hf]
                    obj[keys[chunk]][local] = build(p, inputs, entry.tp_rank, req.tp, scratch)
            obj["checkpoint_version"] = CHECKPOINT_VERSION
            written += save_pt(staging.dir / entry.path, obj)
            del obj
            scratch.clear()
            progress(i, len(hp.files), f"wrote {entry.path}")
            pause_for_tests()
        written += write_manifest(staging.dir, record.manifest(hashes.result())).stat().st_size
        (staging.dir / TRACKER).write_text(RELEASE, encoding="utf-8")
        staging.commit(last=[MANIFEST, TRACKER])
    message = f"wrote {len(hp.files)} rank file(s) to {target}"
    return hp.report("converted", plan, message, written, finite.warnings())


# ---------------------------------------------------------------------------------------------------------
# mm_to_hf


@dataclass
class _Origin:
    """The original HF checkpoint mm_to_hf reproduces: config, naming, sharding, files that travel along."""

    config: dict[str, Any]
    config_bytes: bytes
    weight_map: dict[str, str] | None
    indexed: bool
    root: Path | None
    label: str

    @property
    def newer(self) -> bool:
        """Whether the original used the newer transformers names (hub naming when unknown)."""
        return uses_newer_names(list(self.weight_map or {}), load_table(CONVERTER))

    def extra_files(self) -> list[str]:
        """Top-level files besides the weights (tokenizer, processor, chat template, generation config),
        copied as upstream does; config, index and manifest are written by the export itself."""
        if self.root is None:
            return []
        skip = {CONFIG, MANIFEST, HF_INDEX}
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_file() and p.suffix != ".safetensors" and p.name not in skip
        )


def _origin(req: ConvertRequest, manifest: Manifest | None) -> _Origin:
    """From --hf-dir, else from the source's manifest (an mm-agent hf_to_mm recorded the original)."""
    if req.hf_dir is not None:
        root = Path(req.hf_dir)
        if not (root / CONFIG).is_file():
            raise MMAgentError(
                f"No config.json in {root}", field="hf_dir", fix="pass the original Qwen2.5-VL dir"
            )
        config = read_json(root / CONFIG, "hf_dir")
        index = index_file(root)
        if index is not None:
            weights = read_json(index, "hf_dir").get("weight_map", {})
            wm: dict[str, str] | None = {k: str(v) for k, v in weights.items()}
        else:
            wm = read_hf_source(root, "hf_dir").weight_map if any(root.glob("*.safetensors")) else None
        return _Origin(config, (root / CONFIG).read_bytes(), wm, index is not None, root, f"--hf-dir {root}")
    if manifest is not None and manifest.hf_config is not None:
        raw = (json.dumps(manifest.hf_config, indent=2) + "\n").encode()
        label = str(Path(req.source) / MANIFEST)
        return _Origin(
            manifest.hf_config, raw, manifest.hf_weight_map, manifest.hf_index is not None, None, label
        )
    raise MMAgentError(
        f"no config.json for the export: no --hf-dir, and {req.source} has no manifest recording the original",
        field="hf_dir",
        fix="pass --hf-dir <the original Qwen2.5-VL dir> (config.json, tokenizer and index are taken from it)",
    )


def _check_hf_target(req: ConvertRequest) -> None:
    target = Path(req.target)
    if same_dir(req.source, req.target):
        raise MMAgentError(
            f"{req.method} cannot write into its source", field="target", fix="choose another --target"
        )
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and read_manifest(target) is None)):
        raise MMAgentError(
            f"{target} is not an empty directory",
            field="target",
            fix="export into a new or empty dir (mm_to_hf never writes over other files)",
        )


def _shards(sizes: dict[str, int], wm: dict[str, str] | None) -> tuple[dict[str, list[str]], list[str]]:
    """File -> keys: the original sharding when it covers exactly these keys, else by size."""
    if wm is not None and set(wm) == set(sizes):
        files: dict[str, list[str]] = {}
        for name in wm:
            files.setdefault(wm[name], []).append(name)
        return dict(sorted(files.items())), []
    notes = ["the original weight map does not match the exported keys: sharded by size"] if wm else []
    groups: list[list[str]] = [[]]
    used = 0
    for name in sorted(sizes):
        if groups[-1] and used + sizes[name] > MAX_SHARD_BYTES:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += sizes[name]
    if len(groups) == 1:
        return {"model.safetensors": groups[0]}, notes
    n = len(groups)
    return {f"model-{i:05d}-of-{n:05d}.safetensors": g for i, g in enumerate(groups, 1)}, notes


def _plan_mm_to_hf(req: ConvertRequest) -> NativeLayout:
    """Without torch (the rank files are pickles): checks, and the files the original sharding implies."""
    mapping = load_table(CONVERTER)
    ckpt = find_checkpoint(Path(req.source))
    _check_tp(req, ckpt.tp)
    _check_hf_target(req)
    origin = _origin(req, read_manifest(Path(req.source)))
    check_heads(mapping, Dims.from_config(origin.config), ckpt.tp)
    files = []
    for name in sorted(set((origin.weight_map or {}).values())):
        keys = sum(1 for v in (origin.weight_map or {}).values() if v == name)
        files.append(RankFile(path=name, tp_rank=0, pp_rank=None, keys=keys, bytes=0))
    size = sum(p.stat().st_size for p in ckpt.files.values())
    notes = [f"config.json from {origin.label}; merges TP={ckpt.tp} x {ckpt.pp} stage file(s)"]
    manifest = read_manifest(ckpt.root)  # the split, for the equivalent mm-convert command (flat lists)
    split = {}
    if manifest is not None and manifest.vpp == 1:
        split = {k: _flat(getattr(manifest, k)) for k in ("pp_layers", "vit_pp_layers")}
    elif manifest is not None:
        notes.append(
            "mm-convert's mm_to_hf reads only `model` (no VPP chunks): mm-agent's export is the way here"
        )
    return NativeLayout(
        files=files,
        source_bytes=size,
        output_bytes=size,
        scratch_bytes=size,
        notes=notes,
        resolved={"tp": ckpt.tp, **split},
    )


def _flat(layers: list[int] | list[list[int]] | None) -> list[int] | None:
    """`[[12, 16]]` -> `[12, 16]`: upstream's mm_to_hf takes one flat list per modality."""
    if layers and isinstance(layers[0], list):
        return [n for chunk in layers for n in chunk]
    return layers  # type: ignore[return-value]


def _check_tp(req: ConvertRequest, found: int) -> None:
    if req.tp not in (1, found):
        raise MMAgentError(
            f"tp={req.tp} but {req.source} holds TP={found} rank files",
            field="tp",
            fix=f"drop --tp (mm_to_hf reads it from the checkpoint) or pass --tp {found}",
        )


class _Export:
    """What mm_to_hf reads and writes: the rank files mapped, the HF tensors they hold, the shards."""

    def __init__(self, req: ConvertRequest):
        from mm_agent.convert.vlm_io import read_ranks

        self.mapping = mapping = load_table(CONVERTER)
        self.ckpt = ckpt = find_checkpoint(Path(req.source))
        _check_tp(req, ckpt.tp)
        _check_hf_target(req)
        self.origin = _origin(req, read_manifest(ckpt.root))
        dims = Dims.from_config(self.origin.config)
        check_heads(mapping, dims, ckpt.tp)
        self.ranks, stages, self.dropped = read_ranks(ckpt, mapping)
        params, unknown = expand(mapping, list(self.ranks[0]), dims, "mm")
        if unknown:
            raise _unknown(
                unknown, "a Qwen2.5-VL checkpoint written by mm-convert, mm-agent or a training run"
            )
        if mapping.tie is not None and dims.tie:
            self.dropped += [
                KeyChange(source=p.mm, target=None, reason=TIED) for p in params if p.mm == mapping.tie[0]
            ]
            params = [p for p in params if p.mm != mapping.tie[0]]
        newer = self.origin.newer
        self.hf_name = {h: from_canonical(h, mapping, newer) for p in params for h in p.hf}
        self.owner = {self.hf_name[h]: (p, i) for p in params for i, h in enumerate(p.hf)}
        self.sizes = {n: _hf_bytes(p, i, [r[p.mm] for r in self.ranks]) for n, (p, i) in self.owner.items()}
        self.shards, self.notes = _shards(self.sizes, self.origin.weight_map)
        self.files = [
            RankFile(path=n, tp_rank=0, pp_rank=None, keys=len(k), bytes=sum(self.sizes[x] for x in k))
            for n, k in self.shards.items()
        ]
        self.weight_map = {k: name for name, keys in self.shards.items() for k in keys}
        self.indexed = len(self.shards) > 1 or self.origin.indexed
        vit = stages.of_field(mapping, "vit_pp_layers")
        hf = {"hf_config": self.origin.config, "hf_index": HF_INDEX if self.indexed else None}
        self.record = Record(
            req=req.model_copy(update={"tp": ckpt.tp, "vit_pp_layers": vit.pp_layers if vit else None}),
            direction="mm_to_hf",
            pp_layers=stages.llm.pp_layers,
            vpp=stages.chunks,
            key_count=len(self.weight_map),
            files=self.files,
            source_root=ckpt.root,
            source_files=[ckpt.root / TRACKER, *sorted(ckpt.files.values())],
            hf={**hf, "hf_weight_map": self.weight_map},
        )

    def shard(self, keys: list[str], scratch: Scratch) -> list[tuple[str, torch.Tensor]]:
        """The tensors of one output file, undone from the rank files (merged ones into scratch)."""
        from mm_agent.convert.vlm_io import unbuild

        built: dict[str, torch.Tensor] = {}
        for key in keys:
            p, _ = self.owner[key]
            if key not in built:
                tensors = unbuild(p, [r[p.mm] for r in self.ranks], scratch)
                built.update({self.hf_name[h]: t for h, t in zip(p.hf, tensors, strict=True)})
        return [(k, built[k]) for k in keys]

    def report(
        self,
        status: str,
        plan: ConvertPlan,
        message: str,
        written: int = 0,
        warnings: list[str] | None = None,
    ) -> ConvertReport:
        return ConvertReport(
            status=status,  # type: ignore[arg-type]
            plan=plan,
            message="; ".join([message, *self.notes]),
            keys_converted=len(self.weight_map),
            keys_dropped=self.dropped,
            files=self.files,
            bytes_written=written,
            warnings=warnings or [],
        )


def mm_to_hf(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert.tensors import NonFinite, Scratch, write_index, write_safetensors

    ex = _Export(req)
    finite = NonFinite()
    target = Path(req.target)
    if unchanged(target, None, ex.record) is not None:
        return ex.report("unchanged", plan, f"{target} already holds this export; nothing to do")
    written = 0
    with ThreadPoolExecutor(1) as pool, Staging(target) as staging:
        hashes = pool.submit(hash_sources, ex.record.source_root, ex.record.source_files)
        scratch = Scratch(staging.scratch_dir)
        for i, (name, keys) in enumerate(ex.shards.items(), 1):
            shard = [(k, finite.check(k, t)) for k, t in ex.shard(keys, scratch)]
            written += write_safetensors(staging.dir / name, shard, {"format": "pt"})
            scratch.clear()
            progress(i, len(ex.shards), f"wrote {name}")
            pause_for_tests()
        if ex.indexed:
            write_index(staging.dir / HF_INDEX, ex.weight_map, sum(ex.sizes.values()))
        for extra in ex.origin.extra_files():
            shutil.copy2(Path(str(ex.origin.root)) / extra, staging.dir / extra)
        (staging.dir / CONFIG).write_bytes(ex.origin.config_bytes)
        write_manifest(staging.dir, ex.record.manifest(hashes.result()))
        staging.commit(last=[CONFIG, MANIFEST])
    message = f"wrote {len(ex.shards)} safetensors file(s) to {target}"
    return ex.report("converted", plan, message, written, finite.warnings())


def _hf_bytes(p: Param, index: int, parts: list[torch.Tensor]) -> int:
    """Bytes of HF tensor `p.hf[index]`: its share of the MM tensor (q/k/v by head counts, gate/up half)."""
    total = sum(t.numel() * t.element_size() for t in (parts if p.tp_dim is not None else parts[:1]))
    if p.op == "merge_qkv":
        heads, groups = p.args["heads"], p.args["groups"]
        return total * (heads if index == 0 else groups) // (heads + 2 * groups)
    return total // len(p.hf)


def plan(req: ConvertRequest) -> NativeLayout:
    """Validate a Qwen2_5_VLConverter request and describe what it writes (no torch)."""
    planners = {"hf_to_mm": _plan_hf_to_mm, "mm_to_hf": _plan_mm_to_hf}
    return planners[req.method](req)
