"""WanConverter natively: hf_to_mm, mm_to_hf, resplit (MindSpeed-MM semantics, streaming, atomic).

The key mapping is data (`mappings/WanConverter.yaml`); every Wan tensor is a pure rename, so no tensor is
ever copied: rank files are written from the memory-mapped source. TP is refused as upstream does
(`_enable_tp = False`); PP and VPP come from `pp_layers`. This module imports torch only inside the
methods that convert (`plan` runs in the MCP server).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_agent.convert.atomic import Staging, pause_for_tests
from mm_agent.convert.deviations import plan_notes
from mm_agent.convert.layout import (
    RELEASE,
    TRACKER,
    MMCheckpoint,
    Split,
    find_checkpoint,
    parse_split,
    rank_file,
)
from mm_agent.convert.manifest import MANIFEST, hash_sources, read_manifest, write_manifest
from mm_agent.convert.mapping import Drop, Mapping, load_mapping, map_names
from mm_agent.convert.native import (
    CONFIG,
    HFSource,
    Record,
    count_layers,
    index_file,
    mm_layout,
    place,
    read_hf_source,
    read_json,
    same_dir,
    stage_files,
    target_notes,
    unchanged,
)
from mm_agent.convert.plan import NativeLayout
from mm_agent.convert.schema import ConvertPlan, ConvertReport, ConvertRequest, KeyChange, Manifest, RankFile
from mm_agent.convert.shapes import check_shapes
from mm_agent.errors import MMAgentError

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from mm_agent.convert.tensors import Scratch

    Progress = Callable[[int, int, str], None]

CONVERTER = "WanConverter"
HF_WEIGHTS = "diffusion_pytorch_model"
HF_INDEX = f"{HF_WEIGHTS}.safetensors.index.json"
MAX_SHARD_BYTES = 10 * 1000**3  # diffusers' default max_shard_size ("10GB")


def _mapping(req: ConvertRequest) -> Mapping:
    mapping = load_mapping(CONVERTER)
    mapping.check_tp(req.tp)
    if req.vit_pp_layers:
        raise MMAgentError(
            "vit_pp_layers is for VLM converters; WanConverter splits one DiT",
            field="vit_pp_layers",
            fix="pass the DiT split as pp_layers only",
        )
    return mapping


def _dropped(dropped: dict[str, Drop]) -> list[KeyChange]:
    return [KeyChange(source=k, target=None, reason=d.reason) for k, d in dropped.items()]


# ---------------------------------------------------------------------------------------------------------
# hf_to_mm


class _HFPlan:
    """Everything hf_to_mm decides from the headers: names, split, placement, files."""

    def __init__(self, req: ConvertRequest):
        mapping = _mapping(req)
        self.source = read_hf_source(Path(req.source))
        where = self.source.where
        check_shapes(  # a transposed or reshaped tensor would be renamed as it is
            mapping.shapes,
            {name: info.shape for name, (_, info) in where.items()},
            self.source.config,
            {name: str(header.path) for name, (header, _) in where.items()},
        )
        self.kept, self.dropped = map_names(mapping, list(self.source.where), "hf_to_mm")
        num_layers = count_layers(list(self.kept.values()), mapping)
        configured = (self.source.config or {}).get(mapping.num_layers_field)
        if isinstance(configured, int) and configured != num_layers:
            raise MMAgentError(
                f"config.json says {mapping.num_layers_field}={configured} but the weights hold {num_layers} layers",
                field="source",
                fix="the download is incomplete or mixes two models: re-download the transformer dir",
            )
        self.split = parse_split(req.pp_layers, num_layers)
        self.placement = place(list(self.kept.values()), self.split, mapping)
        sizes = {mm: self.source.where[hf][1].nbytes for hf, mm in self.kept.items()}
        self.files = stage_files(self.placement, sizes, self.split)

    def record(self, req: ConvertRequest) -> Record:
        src = self.source
        return Record(
            req=req,
            direction="hf_to_mm",
            pp_layers=self.split.pp_layers,
            vpp=self.split.chunks if self.split.vpp else 1,
            key_count=len(self.kept),
            files=self.files,
            source_root=src.root,
            source_files=src.files(),
            hf={"hf_config": src.config, "hf_index": src.index_name, "hf_weight_map": src.weight_map},
        )


def _plan_hf_to_mm(req: ConvertRequest) -> NativeLayout:
    hp = _HFPlan(req)
    notes = [f"{len(hp.kept)} tensors renamed (no copies), {hp.split.describe()}"]
    if hp.dropped:
        notes.append(f"{len(hp.dropped)} key(s) dropped: {next(iter(hp.dropped.values())).reason}")
    if same_dir(req.source, req.target):
        notes.append(
            "in-place form: release/ is written next to the diffusers safetensors, which stay untouched"
        )
    notes += target_notes(req, TRACKER, hp.split.pp_layers)
    notes += plan_notes(CONVERTER, _state_dicts(hp.files, hp.split), set(hp.kept.values()))
    return NativeLayout(
        files=hp.files, source_bytes=hp.source.nbytes, output_bytes=hp.source.nbytes, notes=notes
    )


def _state_dicts(files: list[RankFile], split: Split) -> list[str]:
    """`<rank file>:<state dict key>` of every state dict the layout writes."""
    keys = [f"model{i}" for i in range(split.chunks)] if split.vpp else ["model"]
    return [f"{f.path}:{k}" for f in files for k in keys]


def hf_to_mm(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    hp = _HFPlan(req)
    record = hp.record(req)
    readers = _readers(hp.source)

    def tensor(mm_name: str, scratch: Scratch) -> torch.Tensor:
        hf_name = next_hf[mm_name]
        return readers[hp.source.where[hf_name][0].path].get(hf_name)

    next_hf = {mm: hf for hf, mm in hp.kept.items()}
    return _write_mm(
        req,
        plan,
        record,
        hp.split,
        hp.placement,
        tensor,
        progress,
        _dropped(hp.dropped),
        source_names=next_hf,
    )


def _readers(source: HFSource) -> dict[Path, Any]:
    from mm_agent.convert.tensors import SafetensorsFile

    return {h.path: SafetensorsFile(h.path, h) for h in source.headers}


def _write_mm(
    req: ConvertRequest,
    plan: ConvertPlan,
    record: Record,
    split: Split,
    placement: dict[str, tuple[int, int, str]],
    tensor: Callable[[str, Scratch], torch.Tensor],
    progress: Progress,
    dropped: list[KeyChange],
    *,
    source_names: dict[str, str] | None = None,
) -> ConvertReport:
    """Write the MM layout stage by stage into a staging dir, then the manifest, then the tracker.

    `tensor(name, scratch)` gives each tensor when its stage is written; one it computes (a LoRA merge) goes
    into `scratch`, which is emptied after every rank file. Tensors holding NaN/Inf are reported as a
    warning, by their `source_names` (the user's own key) when given."""
    from mm_agent.convert.mmio import save_stage
    from mm_agent.convert.tensors import NonFinite, Scratch

    target = Path(req.target)
    if unchanged(target, TRACKER, record) is not None:
        return ConvertReport(
            status="unchanged",
            plan=plan,
            message=f"{target} already holds this conversion ({split.describe()}); nothing to do",
            keys_converted=record.key_count,
            keys_dropped=dropped,
            files=record.files,
        )
    written = 0
    finite = NonFinite()
    names = source_names or {}
    with ThreadPoolExecutor(1) as pool, Staging(target) as staging:
        hashes = pool.submit(hash_sources, record.source_root, record.source_files)
        scratch = Scratch(staging.scratch_dir)
        for stage, entry in enumerate(record.files):
            chunks: list[dict[str, torch.Tensor]] = [{} for _ in range(split.chunks)]
            for name, (s, chunk, local) in placement.items():
                if s == stage:
                    chunks[chunk][local] = finite.check(names.get(name, name), tensor(name, scratch))
            written += save_stage(staging.dir / entry.path, chunks, split.vpp, scratch)
            del chunks
            scratch.clear()
            progress(stage + 1, len(record.files), f"wrote {entry.path}")
            pause_for_tests()
        written += write_manifest(staging.dir, record.manifest(hashes.result())).stat().st_size
        (staging.dir / TRACKER).write_text(RELEASE, encoding="utf-8")
        staging.commit(last=[MANIFEST, TRACKER])
    return ConvertReport(
        status="converted",
        plan=plan,
        message=f"wrote {len(record.files)} rank file(s) to {target} ({split.describe()})",
        keys_converted=record.key_count,
        keys_dropped=dropped,
        files=record.files,
        bytes_written=written,
        warnings=finite.warnings(),
    )


# ---------------------------------------------------------------------------------------------------------
# MM sources (resplit, mm_to_hf)


def _mm_source(req: ConvertRequest) -> tuple[MMCheckpoint, Manifest | None]:
    source = Path(req.source)
    manifest = read_manifest(source) if source.is_dir() else None
    ckpt = find_checkpoint(source, expected=[f.path for f in manifest.files] if manifest else None)
    if ckpt.tp != 1:
        raise MMAgentError(
            f"{source} has TP={ckpt.tp} rank files; WanConverter has no tensor parallelism",
            field="source",
            fix="pass a checkpoint written with tp_size 1",
        )
    if same_dir(req.source, req.target):
        raise MMAgentError(
            f"{req.method} cannot write into its own source",
            field="target",
            fix="choose another --target (the source checkpoint is read while the new one is written)",
        )
    return ckpt, manifest


def _mm_files(ckpt: MMCheckpoint) -> list[Path]:
    return [ckpt.root / TRACKER, *sorted(ckpt.files.values())]


def _mm_bytes(ckpt: MMCheckpoint) -> int:
    return sum(p.stat().st_size for p in ckpt.files.values())


def _hf_fields(manifest: Manifest | None) -> dict[str, Any]:
    if manifest is None:
        return {}
    return {
        "hf_config": manifest.hf_config,
        "hf_index": manifest.hf_index,
        "hf_weight_map": manifest.hf_weight_map,
    }


def _plan_resplit(req: ConvertRequest) -> NativeLayout:
    _mapping(req)
    ckpt, manifest = _mm_source(req)
    notes = []
    if manifest is not None and manifest.pp_layers:
        total = parse_split(manifest.pp_layers, _sum(manifest.pp_layers)).num_layers
    else:
        total = _sum(req.pp_layers) if req.pp_layers else 0
        notes.append("the source has no manifest: its layer count is checked when converting")
    split = parse_split(req.pp_layers, total)
    notes += target_notes(req, TRACKER, split.pp_layers)
    files = [
        RankFile(
            path=rank_file(0, split.pp_rank(s)),
            tp_rank=0,
            pp_rank=split.pp_rank(s),
            keys=0,
            bytes=0,
            layers=split.layers(s),
        )
        for s in range(split.pp)
    ]
    notes.append(
        f"resplit {ckpt.pp}-stage checkpoint into {split.describe()}; counts are known after converting"
    )
    if manifest is not None and manifest.hf_weight_map:  # the tensors it holds, named by the original
        mapping = _mapping(req)
        names = {m for h in manifest.hf_weight_map if isinstance(m := mapping.hf_to_mm(h), str)}
        notes += plan_notes(CONVERTER, _state_dicts(files, split), names)
    size = _mm_bytes(ckpt)
    return NativeLayout(files=files, source_bytes=size, output_bytes=size, notes=notes)


def _sum(pp_layers: list[int] | list[list[int]]) -> int:
    return sum(sum(v) if isinstance(v, list) else v for v in pp_layers)


def resplit(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert.mmio import load_merged

    mapping = _mapping(req)
    ckpt, manifest = _mm_source(req)
    merged, _ = load_merged(ckpt, mapping.layer_prefix)
    names, split, placement, files = mm_layout(req.pp_layers, merged, mapping)
    record = Record(
        req=req,
        direction="resplit",
        pp_layers=split.pp_layers,
        vpp=split.chunks if split.vpp else 1,
        key_count=len(names),
        files=files,
        source_root=ckpt.root,
        source_files=_mm_files(ckpt),
        hf=_hf_fields(manifest),
    )
    return _write_mm(req, plan, record, split, placement, lambda name, _: merged[name], progress, [])


# ---------------------------------------------------------------------------------------------------------
# mm_to_hf


class _HFTarget:
    """Where mm_to_hf takes config.json and the sharding from: --hf-dir, the source's manifest, or the
    source dir itself (the in-place form keeps the original diffusers files beside release/)."""

    def __init__(self, req: ConvertRequest, manifest: Manifest | None):
        self.config: bytes
        self.index: str | None
        self.weight_map: dict[str, str] | None
        self.single: str | None = None  # name of the original's one unsharded file
        source = Path(req.source)
        if req.hf_dir is not None:
            self._from_dir(Path(req.hf_dir), "hf_dir")
            self.origin = f"--hf-dir {req.hf_dir}"
        elif manifest is not None and manifest.hf_config is not None:
            self.config = (json.dumps(manifest.hf_config, indent=2, sort_keys=True) + "\n").encode()
            self.index, self.weight_map = manifest.hf_index, manifest.hf_weight_map
            self.origin = f"{source / MANIFEST}"
        elif (source / CONFIG).is_file():
            self._from_dir(source, "source")
            self.origin = f"{source} (in-place form)"
        else:
            raise MMAgentError(
                f"no config.json for the export: no --hf-dir, and {source} has neither a manifest recording "
                "the original nor a config.json",
                field="hf_dir",
                fix="pass --hf-dir <the original diffusers transformer/ dir>",
            )

    def _from_dir(self, root: Path, field: str) -> None:
        if not (root / CONFIG).is_file():
            raise MMAgentError(
                f"No config.json in {root}", field=field, fix="pass the original diffusers transformer/ dir"
            )
        self.config = (root / CONFIG).read_bytes()
        read_json(root / CONFIG, field)
        index = index_file(root)
        self.index = index.name if index else None
        if index is not None:
            self.weight_map = {k: str(v) for k, v in read_json(index, field).get("weight_map", {}).items()}
        else:
            singles = sorted(p.name for p in root.glob("*.safetensors"))
            self.weight_map = None
            self.single = singles[0] if len(singles) == 1 else None

    def shards(self, sizes: dict[str, int]) -> tuple[dict[str, list[str]], bool, list[str]]:
        """file name -> keys, whether to write an index, notes. Reproduces the original sharding when it
        covers exactly these keys; otherwise shards by size the way diffusers does."""
        names = sorted(sizes)
        wm = self.weight_map
        if wm is not None and set(wm) == set(names):
            files: dict[str, list[str]] = {}
            for name in names:
                files.setdefault(wm[name], []).append(name)
            return dict(sorted(files.items())), self.index is not None or len(files) > 1, []
        notes = []
        if wm is not None:
            notes.append("the original weight map does not match the converted keys: sharded by size instead")
        if wm is None and self.single is not None and sum(sizes.values()) <= MAX_SHARD_BYTES:
            return {self.single: names}, False, notes
        groups: list[list[str]] = [[]]
        used = 0
        for name in names:
            if groups[-1] and used + sizes[name] > MAX_SHARD_BYTES:
                groups.append([])
                used = 0
            groups[-1].append(name)
            used += sizes[name]
        if len(groups) == 1:
            return {f"{HF_WEIGHTS}.safetensors": groups[0]}, False, notes
        n = len(groups)
        return (
            {f"{HF_WEIGHTS}-{i:05d}-of-{n:05d}.safetensors": g for i, g in enumerate(groups, 1)},
            True,
            notes,
        )


def _check_hf_target(req: ConvertRequest) -> None:
    target = Path(req.target)
    if target.exists() and not target.is_dir():
        raise MMAgentError(f"{target} exists and is not a directory", field="target", fix="pass a new dir")
    if target.is_dir() and any(target.iterdir()) and read_manifest(target) is None:
        raise MMAgentError(
            f"{target} is not empty",
            field="target",
            fix="export into a new or empty dir (mm_to_hf never writes over other files)",
        )


def _plan_mm_to_hf(req: ConvertRequest) -> NativeLayout:
    _mapping(req)
    ckpt, manifest = _mm_source(req)
    _check_hf_target(req)
    hf = _HFTarget(req, manifest)
    notes = [f"config.json from {hf.origin}"]
    if req.pp_layers:
        notes.append("mm_to_hf reads the split from the checkpoint: pp_layers is not used")
    files = []
    if hf.weight_map is not None:
        for name in sorted(set(hf.weight_map.values())):
            keys = sum(1 for v in hf.weight_map.values() if v == name)
            files.append(RankFile(path=name, tp_rank=0, pp_rank=None, keys=keys, bytes=0))
    size = _mm_bytes(ckpt)
    notes.append(f"merges {ckpt.pp} stage file(s) of {ckpt.root / ckpt.iteration}")
    return NativeLayout(files=files, source_bytes=size, output_bytes=size, notes=notes)


def mm_to_hf(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert.mmio import load_merged
    from mm_agent.convert.tensors import NonFinite, write_index, write_safetensors

    mapping = _mapping(req)
    ckpt, manifest = _mm_source(req)
    _check_hf_target(req)
    hf = _HFTarget(req, manifest)
    merged, source_split = load_merged(ckpt, mapping.layer_prefix)
    kept, dropped = map_names(mapping, list(merged), "mm_to_hf")
    tensors = {hf_name: merged[mm_name] for mm_name, hf_name in kept.items()}
    sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    shards, with_index, notes = hf.shards(sizes)
    files = [
        RankFile(path=name, tp_rank=0, pp_rank=None, keys=len(keys), bytes=sum(sizes[k] for k in keys))
        for name, keys in shards.items()
    ]
    weight_map = {k: name for name, keys in shards.items() for k in keys}
    record = Record(
        req=req,
        direction="mm_to_hf",
        pp_layers=source_split.pp_layers,
        vpp=source_split.chunks if source_split.vpp else 1,
        key_count=len(kept),
        files=files,
        source_root=ckpt.root,
        source_files=_mm_files(ckpt),
        hf={
            "hf_config": json.loads(hf.config),
            "hf_index": HF_INDEX if with_index else None,
            "hf_weight_map": weight_map,
        },
    )
    target = Path(req.target)
    changes = _dropped(dropped)
    if unchanged(target, None, record) is not None:
        return ConvertReport(
            status="unchanged",
            plan=plan,
            message=f"{target} already holds this export; nothing to do",
            keys_converted=len(kept),
            keys_dropped=changes,
            files=files,
        )
    written = 0
    finite = NonFinite()
    with ThreadPoolExecutor(1) as pool, Staging(target) as staging:
        hashes = pool.submit(hash_sources, record.source_root, record.source_files)
        for i, (name, keys) in enumerate(shards.items(), 1):
            written += write_safetensors(
                staging.dir / name, [(k, finite.check(k, tensors[k])) for k in keys], {"format": "pt"}
            )
            progress(i, len(shards), f"wrote {name}")
            pause_for_tests()
        if with_index:
            write_index(staging.dir / HF_INDEX, weight_map, sum(sizes.values()))
        (staging.dir / CONFIG).write_bytes(hf.config)
        write_manifest(staging.dir, record.manifest(hashes.result()))
        staging.commit(last=[CONFIG, MANIFEST])
    return ConvertReport(
        status="converted",
        plan=plan,
        message=f"wrote {len(shards)} safetensors file(s) to {target}; config.json from {hf.origin}"
        + "".join(f"; {n}" for n in notes),
        keys_converted=len(kept),
        keys_dropped=changes,
        files=files,
        bytes_written=written,
        warnings=finite.warnings(),
    )


def merge_lora_to_base(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert import lora

    return lora.merge_lora_to_base(req, plan, progress)


def lora_hf_to_mm(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert import lora

    return lora.lora_hf_to_mm(req, plan, progress)


def plan(req: ConvertRequest) -> NativeLayout:
    """Validate a WanConverter request and describe what it writes (no torch)."""
    from mm_agent.convert import lora

    planners = {
        "hf_to_mm": _plan_hf_to_mm,
        "resplit": _plan_resplit,
        "mm_to_hf": _plan_mm_to_hf,
        "merge_lora_to_base": lora.plan_merge,
        "lora_hf_to_mm": lora.plan_lora_hf_to_mm,
    }
    return planners[req.method](req)
