"""Table-driven plumbing for VLM converters (MindSpeed-MM `checkpoint/vlm_model` semantics), no torch.

A VLM table (`mappings/<Converter>.yaml` with `modalities`) lists every MM tensor as one transform of HF
tensors. Here it is expanded against a real key set (in either direction), checked against the model's
config (layer counts, head counts that TP must divide) and placed on pipeline stages the way upstream's
`partition_state_dict_by_pp` does: each modality has its own `pp_layers`, its layers renumbered from 0 per
stage, its first/last names on the first/last stage that holds any of its layers. Unlike upstream, a key
the table does not know is an error, never a silent drop. The planner (MCP server) uses this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mm_agent.convert.layout import Split, parse_split, rank_file
from mm_agent.convert.mapping import Mapping, Modality, Transform, load_mapping
from mm_agent.convert.schema import RankFile
from mm_agent.errors import MMAgentError

Layers = list[int] | list[list[int]]
OPS = frozenset({"rename", "merge_qkv", "relocate_qkv", "merge_gate_up"})


def load_table(converter: str) -> Mapping:
    """A VLM table, checked beyond its schema: ops the converters implement, merges split on dim 0
    only (their TP rows are built per rank), and an LLM modality that `pp_layers` splits."""
    mapping = load_mapping(converter)
    where = f"mm_agent/convert/mappings/{converter}.yaml"
    for t in mapping.transforms:
        if t.op not in OPS:
            raise MMAgentError(f"{t.mm}: unknown op {t.op!r}", file=where, fix=f"use one of {sorted(OPS)}")
        if t.op != "rename" and t.tp_dim == 1:
            raise MMAgentError(f"{t.mm}: {t.op} cannot split on dim 1", file=where, fix="use tp_dim 0")
    if not any(m.pp_field == "pp_layers" for m in mapping.modalities):
        raise MMAgentError("no modality uses pp_layers", file=where, fix="add the LLM modality")
    return mapping


@dataclass(frozen=True)
class Param:
    """One MM tensor (global layer ids) and the canonical HF tensors it is built from."""

    mm: str
    hf: tuple[str, ...]
    op: str
    args: dict[str, int]
    tp_dim: int | None
    step: int | None = None  # the table's upstream_step (None: MindSpeed-MM's TieOp, after every op)


@dataclass
class Dims:
    """The config values a table refers to as `text.<field>` / `vision.<field>`, and the tie flag."""

    values: dict[str, Any]
    tie: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Dims:
        """Hub configs keep the LLM fields at the top level; transformers 5 nests them in `text_config`."""
        text = {**config, **(config.get("text_config") or {})}
        vision = config.get("vision_config") or {}
        values = {f"text.{k}": v for k, v in text.items()} | {f"vision.{k}": v for k, v in vision.items()}
        tie = bool(config.get("tie_word_embeddings")) or bool(text.get("tie_word_embeddings"))
        return cls(values, tie)

    def int(self, name: str) -> int:
        value = self.values.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MMAgentError(
                f"config.json has no positive integer {name.replace('.', '_config.', 1)} (got {value!r})",
                field="source",
                fix="pass the model's original Hugging Face dir (its config.json describes the weights)",
            )
        return value


# ---------------------------------------------------------------------------------------------------------
# names


def to_canonical(name: str, mapping: Mapping) -> str:
    """The table's name for an HF key written in either naming (`model.language_model.` -> `model.`)."""
    for newer, table in mapping.hf_prefixes:
        if name.startswith(newer):
            return table + name[len(newer) :]
    return name


def from_canonical(name: str, mapping: Mapping, newer: bool) -> str:
    """Inverse of `to_canonical` for the naming a checkpoint uses (`newer`: transformers >= 4.52)."""
    if newer:
        for new, table in mapping.hf_prefixes:
            if name.startswith(table):
                return new + name[len(table) :]
    return name


def uses_newer_names(names: list[str], mapping: Mapping) -> bool:
    """Whether HF keys use the newer naming; a mix of both is refused (two models in one dir)."""
    table = tuple(t for _, t in mapping.hf_prefixes)
    newer = any(to_canonical(n, mapping) != n for n in names)
    older = any(to_canonical(n, mapping) == n and n.startswith(table) for n in names)
    if newer and older:
        raise MMAgentError(
            "the weights mix the hub naming (model.layers.N) with the newer transformers naming "
            "(model.language_model.layers.N)",
            field="source",
            fix="keep the safetensors files of one checkpoint only in the dir",
        )
    return newer


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\*", r"(\d+)") + "$")


def expand(mapping: Mapping, names: list[str], dims: Dims, side: str) -> tuple[list[Param], list[str]]:
    """The Params a key set holds, and the keys no transform claims.

    `side` is "hf" (canonical HF names: the HF tensors of a transform must all be present) or "mm"
    (MM names with global layer ids). Missing partners and missing layers are errors naming the key.
    """
    have = set(names)
    claimed: set[str] = set()
    params: list[Param] = []
    for t in mapping.transforms:
        key = t.hf[0] if side == "hf" else t.mm
        if "*" in key:
            ids = sorted({m.group(1) for n in names if (m := _pattern(key).match(n))}, key=int)
        else:
            ids = ["*"] if key in have else []
        for i in ids:
            hf = tuple(h.replace("*", i) for h in t.hf)
            mm = t.mm.replace("*", i)
            needed = hf if side == "hf" else (mm,)
            missing = [n for n in needed if n not in have]
            if missing:
                raise MMAgentError(
                    f"{missing[0]} is missing (needed with {needed[0]} for {mm})",
                    field="source",
                    fix="the checkpoint is incomplete or not a "
                    f"{mapping.description} checkpoint: re-download or re-export it",
                )
            claimed.update(needed)
            params.append(Param(mm, hf, t.op, _args(t, dims), t.tp_dim, t.upstream_step))
    _check_layers(mapping, params, dims)
    return params, [n for n in names if n not in claimed]


def upstream_order(mapping: Mapping, params: list[Param], source: list[str]) -> list[Param]:
    """`params` in the order MindSpeed-MM's state dict holds them, so the rank files list (and pickle) their
    tensors as MindSpeed-MM's do. Its state dict starts as the canonical HF keys in `source` order (the
    safetensors files in name order, each in header order: what its `load_file`s give for a single file or
    a sorted directory listing); then each of the table's `upstream_ops` runs in turn: a merge pops its inputs
    and appends the merged key layer by layer, a rename pops each key it renames and appends the new name in
    the current order; a tied output layer (step None, TieOp) comes last. Tables without `upstream_ops` keep
    their own order."""
    if not mapping.upstream_ops:
        return params
    order: dict[str, None] = dict.fromkeys(source)  # an ordered set: HF names, then MM names as ops run
    for step, op in enumerate(mapping.upstream_ops):
        members = [p for p in params if p.step == step]  # a merge's layers come out of `expand` ascending
        if op.kind == "merge":
            for p in members:
                for name in p.hf:
                    order.pop(name, None)
                order[p.mm] = None
        else:
            renamed = {p.hf[0]: p.mm for p in members}
            for old in [n for n in order if n in renamed]:
                del order[old]
                order[renamed[old]] = None
    for p in params:
        order.setdefault(p.mm, None)
    position = {name: i for i, name in enumerate(order)}
    return sorted(params, key=lambda p: position[p.mm])


def _args(t: Transform, dims: Dims) -> dict[str, int]:
    return {k: dims.int(v) if isinstance(v, str) else v for k, v in t.args.items()}  # type: ignore[misc]


def _check_layers(mapping: Mapping, params: list[Param], dims: Dims) -> None:
    """Every layer of every modality is present, and the non-layer tensors too (bar a tied output)."""
    found = {p.mm for p in params}
    for t in mapping.transforms:
        if "*" in t.mm:
            mod = modality_of(mapping, t.mm.replace("*", "0"))
            want = dims.int(mod.num_layers) if mod else 0
            missing = [i for i in range(want) if t.mm.replace("*", str(i)) not in found]
        else:
            tied = mapping.tie is not None and t.mm == mapping.tie[0] and dims.tie
            missing = [] if tied or t.mm in found else [0]
        if missing:
            raise MMAgentError(
                f"no weights for {t.mm.replace('*', str(missing[0]))} (from {t.hf[0].replace('*', str(missing[0]))})",
                field="source",
                fix="the checkpoint does not match its config.json (layer counts, tie_word_embeddings) or "
                "is incomplete: re-download or re-export it",
            )


def modality_of(mapping: Mapping, mm_name: str) -> Modality | None:
    for mod in mapping.modalities:
        rest = mm_name[len(mod.layer_prefix) :] if mm_name.startswith(mod.layer_prefix) else ""
        if rest.split(".")[0].isdigit() or any(mm_name.startswith(p) for p in (*mod.first, *mod.last)):
            return mod
    return None


def check_heads(mapping: Mapping, dims: Dims, tp: int) -> None:
    """TP must divide the KV groups (LLM) and heads (ViT) of every fused QKV: a rank holds whole groups,
    so tp <= num_key_value_heads (upstream's check, with its message)."""
    fused = [(arg, t) for arg in ("groups", "heads") for t in mapping.transforms if arg in t.args]
    for arg, t in fused:  # KV groups first: the limit users hit (upstream checks only those)
        value = _args(t, dims)[arg]
        if value % tp:
            what = "key-value heads" if arg == "groups" else "attention heads"
            best = max(d for d in range(1, min(tp, value) + 1) if value % d == 0)
            mod = modality_of(mapping, t.mm.replace("*", "0"))
            raise MMAgentError(
                f"Number of {what} ({value}) must be divisible by TP size ({tp}) ({mod.name if mod else t.mm})",
                field="tp",
                fix=f"use a tp that divides {value} (tp <= num_key_value_heads), e.g. --tp {best}",
            )


def check_dims(params: list[Param], shapes: dict[str, tuple[int, ...]], tp: int) -> None:
    """Every split dim divides by tp (upstream would silently drop the remainder rows). `shapes`: HF
    shapes by canonical name."""
    for p in params:
        if p.tp_dim is None:
            continue
        for name in p.hf:
            size = shapes[name][p.tp_dim] // (3 if p.op == "relocate_qkv" else 1)
            if size % tp:
                raise MMAgentError(
                    f"{name} has {size} along dim {p.tp_dim}, which TP size {tp} does not divide",
                    field="tp",
                    fix="choose a tp that divides it (the table splits this tensor across TP ranks)",
                )


# ---------------------------------------------------------------------------------------------------------
# pipeline placement


@dataclass
class Stages:
    """Per-modality splits with the same (chunks, stages) grid; flat slot = chunk * pp + stage."""

    splits: dict[str, Split]
    llm: Split
    notes: list[str] = field(default_factory=list)

    @property
    def pp(self) -> int:
        return self.llm.pp

    @property
    def chunks(self) -> int:
        return self.llm.chunks

    def of_field(self, mapping: Mapping, pp_field: str) -> Split | None:
        """The split of the modality a request field (`pp_layers`, `vit_pp_layers`) describes."""
        return next((self.splits[m.name] for m in mapping.modalities if m.pp_field == pp_field), None)

    def model_keys(self) -> list[str]:
        """`model`, or `model0..N` when there is more than one VPP chunk (upstream `save_by_vpp`)."""
        return ["model"] if self.chunks == 1 else [f"model{c}" for c in range(self.chunks)]


def parse_stages(mapping: Mapping, dims: Dims, pp_layers: Layers | None, vit: Layers | None) -> Stages:
    """Both splits validated against the config; a missing ViT split puts the ViT on the first stage, as
    every MindSpeed-MM example does ([32, 0, ...])."""
    given = {"pp_layers": pp_layers, "vit_pp_layers": vit}
    splits: dict[str, Split] = {}
    notes = []
    llm_mod = next(m for m in mapping.modalities if m.pp_field == "pp_layers")
    llm = parse_split(pp_layers, dims.int(llm_mod.num_layers), "pp_layers")
    for mod in mapping.modalities:
        total = dims.int(mod.num_layers)
        value = given[mod.pp_field]
        if value:
            split = parse_split(value, total, mod.pp_field)
        else:
            split = Split(
                tuple(tuple(total if c == s == 0 else 0 for s in range(llm.pp)) for c in range(llm.chunks)),
                llm.vpp,
            )
            if llm.pp * llm.chunks > 1:
                notes.append(f"{mod.pp_field} not given: all {total} {mod.name} layers on the first stage")
        if (split.chunks, split.pp) != (llm.chunks, llm.pp):
            raise MMAgentError(
                f"{mod.pp_field} {split.pp_layers} has {split.chunks}x{split.pp} (chunks x stages) entries but "
                f"pp_layers {llm.pp_layers} has {llm.chunks}x{llm.pp}",
                field=mod.pp_field,
                fix=f"give one count per stage for every modality, e.g. vit_pp_layers "
                f"{[dims.int(mod.num_layers)] + [0] * (llm.pp - 1)} with pp_layers {llm.pp_layers}",
            )
        splits[mod.name] = split
    return Stages(splits, llm, notes)


def _flat(split: Split) -> list[int]:
    return [n for chunk in split.counts for n in chunk]


def place(mapping: Mapping, stages: Stages, mm_name: str) -> tuple[int, int, str]:
    """(stage, chunk, name inside that chunk's state dict) of a global MM name."""
    mod = modality_of(mapping, mm_name)
    if mod is None:
        raise MMAgentError(
            f"{mm_name} belongs to no modality of the table",
            file=f"mm_agent/convert/mappings/{mapping.converter}.yaml",
            fix="add its prefix to a modality's first/last list",
        )
    split = stages.splits[mod.name]
    flat = _flat(split)
    rest = mm_name[len(mod.layer_prefix) :] if mm_name.startswith(mod.layer_prefix) else ""
    head = rest.split(".")[0]
    if head.isdigit():
        stage, chunk, local = split.locate(int(head))
        return stage, chunk, f"{mod.layer_prefix}{local}{rest[len(head) :]}"
    used = [i for i, n in enumerate(flat) if n]
    slot = used[0] if any(mm_name.startswith(p) for p in mod.first) else used[-1]
    return slot % stages.pp, slot // stages.pp, mm_name


def layout_files(
    mapping: Mapping, stages: Stages, sizes: dict[str, tuple[int, int | None]], tp: int
) -> list[RankFile]:
    """Rank files in write order (TP rank, then stage). `sizes`: MM name -> (bytes, tp_dim)."""
    counts: dict[int, list[int]] = {s: [0, 0] for s in range(stages.pp)}
    for name, (nbytes, dim) in sizes.items():
        stage = place(mapping, stages, name)[0]
        counts[stage][0] += 1
        counts[stage][1] += nbytes // tp if dim is not None else nbytes
    files = []
    for rank in range(tp):
        for stage in range(stages.pp):
            pp_rank = stage if stages.pp > 1 else None
            files.append(
                RankFile(
                    path=rank_file(rank, pp_rank),
                    tp_rank=rank,
                    pp_rank=pp_rank,
                    keys=counts[stage][0],
                    bytes=counts[stage][1],
                    layers=stages.llm.layers(stage),
                )
            )
    return files
