"""Plumbing shared by the native converters, without torch: sources, stage placement, re-run decisions.

An HF source is read from its safetensors headers (keys, dtypes, shapes, offsets), so planning a 28 GB
checkpoint costs milliseconds. Placement follows MindSpeed-MM's `_pp_vpp_split`: pre-process names on the
first stage, post-process names on the last, layer keys by cumulative counts renumbered from 0, and (unlike
upstream, which silently drops them) any other key is an error when the model is split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_agent.convert.headers import Header, TensorInfo, read_header, safetensors_files
from mm_agent.convert.layout import LayerKeys, Split, parse_split, rank_file
from mm_agent.convert.manifest import (
    SETTINGS,
    check_rerun,
    existing_state,
    hash_sources,
    now,
    refuse_differences,
    setting_differences,
    source_stats,
    version,
)
from mm_agent.convert.mapping import Mapping
from mm_agent.convert.schema import ConvertRequest, Manifest, RankFile
from mm_agent.errors import MMAgentError

CONFIG = "config.json"


@dataclass
class HFSource:
    """An HF model dir as seen through its headers."""

    root: Path
    headers: list[Header]
    where: dict[str, tuple[Header, TensorInfo]]
    config: dict[str, Any] | None
    index_name: str | None

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.headers)

    @property
    def weight_map(self) -> dict[str, str]:
        return {name: h.path.name for name, (h, _) in self.where.items()}

    def files(self) -> list[Path]:
        """Everything the conversion depends on (hashed into the manifest)."""
        extra = [self.root / n for n in (CONFIG, self.index_name) if n and (self.root / n).is_file()]
        return sorted([h.path for h in self.headers] + extra)


def read_json(path: Path, field: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MMAgentError(
            f"unreadable JSON: {exc}", file=str(path), field=field, fix="restore the file"
        ) from exc
    if not isinstance(data, dict):
        raise MMAgentError("expected a JSON object", file=str(path), field=field, fix="restore the file")
    return data


def index_file(root: Path) -> Path | None:
    """The `*.safetensors.index.json` of an HF dir (diffusers or transformers naming), if any."""
    found = sorted(root.glob("*.safetensors.index.json"))
    return found[0] if found else None


def read_hf_source(root: Path, field: str = "source") -> HFSource:
    files = safetensors_files(root, field)
    headers = [read_header(p) for p in files]
    where: dict[str, tuple[Header, TensorInfo]] = {}
    for header in headers:
        for name, info in header.tensors.items():
            if name in where:
                raise MMAgentError(
                    f"tensor {name!r} is in both {where[name][0].path.name} and {header.path.name}",
                    field=field,
                    fix="remove stray or duplicate safetensors files from the dir (keep one copy of the model)",
                )
            where[name] = (header, info)
    config = read_json(root / CONFIG, field) if (root / CONFIG).is_file() else None
    index = index_file(root)
    return HFSource(root, headers, where, config, index.name if index else None)


def count_layers(mm_names: list[str], mapping: Mapping) -> int:
    """Number of layers (`<prefix>N.` keys); ids must run 0..N-1 without gaps."""
    keys = LayerKeys(mapping.layer_prefix)
    ids = {i for i in (keys.index(n) for n in mm_names) if i is not None}
    if ids and ids != set(range(max(ids) + 1)):
        missing = sorted(set(range(max(ids) + 1)) - ids)
        raise MMAgentError(
            f"layers {missing[:5]} are missing ({mapping.layer_prefix}N keys)",
            field="source",
            fix="the checkpoint is incomplete: re-download or re-export it",
        )
    return len(ids)


def place(mm_names: list[str], split: Split, mapping: Mapping) -> dict[str, tuple[int, int, str]]:
    """MM name -> (stage, chunk, name inside that chunk's state dict)."""
    keys = LayerKeys(mapping.layer_prefix)
    single = split.pp == 1 and split.chunks == 1
    out: dict[str, tuple[int, int, str]] = {}
    stray: list[str] = []
    for name in mm_names:
        role = mapping.stage_role(name)
        if role == "layer":
            layer = keys.index(name)
            assert layer is not None
            stage, chunk, local = split.locate(layer)
            out[name] = (stage, chunk, keys.renumber(name, local))
        elif role == "post":
            out[name] = (split.pp - 1, split.chunks - 1, name)
        elif role == "pre" or single:
            out[name] = (0, 0, name)
        else:
            stray.append(name)
    if stray:
        raise MMAgentError(
            f"{len(stray)} key(s) belong to no pipeline stage: {', '.join(stray[:5])}",
            file=f"mm_agent/convert/mappings/{mapping.converter}.yaml",
            field="pp_layers",
            fix="convert with PP=1 (no pp_layers), or add the keys to pre_process/post_process of the table",
        )
    return out


def mm_layout(
    pp_layers: Any, tensors: dict[str, Any], mapping: Mapping
) -> tuple[list[str], Split, dict[str, tuple[int, int, str]], list[RankFile]]:
    """(names, split, placement, rank files) of a merged MM state dict written with `pp_layers` (resplit, merge)."""
    names = list(tensors)
    split = parse_split(pp_layers, count_layers(names, mapping))
    placement = place(names, split, mapping)
    sizes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    return names, split, placement, stage_files(placement, sizes, split)


def stage_files(
    placement: dict[str, tuple[int, int, str]], sizes: dict[str, int], split: Split, tp_rank: int = 0
) -> list[RankFile]:
    """The rank files a placement produces, with key and byte counts."""
    files = []
    for stage in range(split.pp):
        names = [n for n, (s, _, _) in placement.items() if s == stage]
        pp_rank = split.pp_rank(stage)
        files.append(
            RankFile(
                path=rank_file(tp_rank, pp_rank),
                tp_rank=tp_rank,
                pp_rank=pp_rank,
                keys=len(names),
                bytes=sum(sizes[n] for n in names),
                layers=split.layers(stage),
            )
        )
    return files


def same_dir(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


@dataclass
class Record:
    """What a conversion will record in its manifest, before the source hashes are known."""

    req: ConvertRequest
    direction: str
    pp_layers: list[int] | list[list[int]] | None
    vpp: int
    key_count: int
    files: list[RankFile]
    source_root: Path
    source_files: list[Path]
    hf: dict[str, Any] = field(default_factory=dict)  # hf_config / hf_index / hf_weight_map

    def manifest(self, hashes: dict[str, str]) -> Manifest:
        stats = source_stats(self.source_root, self.source_files)
        return Manifest(
            converter=self.req.converter,
            method=self.req.method,
            direction=self.direction,  # type: ignore[arg-type]
            mm_agent_version=version(),
            source_files=hashes,
            source_mtimes={rel: mtime for rel, (_, mtime) in stats.items()},
            tp=self.req.tp,
            pp_layers=self.pp_layers,
            vit_pp_layers=self.req.vit_pp_layers,
            vpp=self.vpp,
            lora_rank=self.req.lora_rank,
            lora_alpha=self.req.lora_alpha,
            key_count=self.key_count,
            files=self.files,
            created=now(),
            **self.hf,
        )


def unchanged(target: Path, marker: str | None, record: Record) -> Manifest | None:
    """The existing manifest when `target` already holds this exact conversion (a no-op re-run).

    Raises when it holds a conversion with other settings or sources, or a checkpoint mm-agent did not
    write; returns None when there is nothing to honour (absent, or an interrupted run).
    """
    existing = existing_state(target, marker)
    if existing is None:
        return None
    hashes = hash_sources(record.source_root, record.source_files, existing)
    check_rerun(target, existing, record.manifest(hashes))
    return existing


def target_notes(
    req: ConvertRequest, marker: str | None, pp_layers: list[int] | list[list[int]] | None
) -> list[str]:
    """The dry run's view of the target: a conflicting earlier conversion is an error now (not after the
    run started); the same one is a note (a no-op unless the sources changed). Sources are not hashed."""
    target = Path(req.target)
    existing = existing_state(target, marker)
    if existing is None:
        return []
    requested = {f: getattr(req, f) for f in SETTINGS} | {"pp_layers": pp_layers}
    refuse_differences(target, existing, setting_differences(existing, requested))
    return [f"{target} already holds this conversion: converting again is a no-op unless the sources changed"]
