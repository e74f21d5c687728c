"""WanConverter's LoRA methods natively: merge_lora_to_base and lora_hf_to_mm (MindSpeed-MM semantics).

merge_lora_to_base adds `scaling * B @ A` (scaling = alpha / rank) to every base weight a LoRA pair targets,
with the very torch operation MindSpeed-MM's `lora_merge_to_base` runs (`addmm_`), so the merged weights are
bitwise its own; the merged tensors live in file-backed scratch one rank file at a time, the untouched ones
are written from the memory-mapped base. lora_hf_to_mm renames an HF (DiffSynth) LoRA file's keys with the
table's `lora.replace` rules and splits them like hf_to_mm. Where MindSpeed-MM merges silently whatever it
finds, this refuses what cannot be meant: rank 0 or a rank the adapters do not have, an adapter without its
base weight or without its other half, base and LoRA of different layouts. Planning imports no torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_agent.convert.layout import TRACKER, MMCheckpoint, find_checkpoint, parse_split, rank_file
from mm_agent.convert.mapping import LoraRules, Mapping
from mm_agent.convert.native import (
    Record,
    count_layers,
    mm_layout,
    place,
    read_hf_source,
    same_dir,
    stage_files,
    target_notes,
)
from mm_agent.convert.plan import NativeLayout
from mm_agent.convert.schema import ConvertPlan, ConvertReport, ConvertRequest, KeyChange, RankFile
from mm_agent.convert.wan import (
    CONVERTER,
    _dropped,
    _hf_fields,
    _mapping,
    _mm_bytes,
    _mm_files,
    _mm_source,
    _readers,
    _sum,
    _write_mm,
)
from mm_agent.errors import MMAgentError

if TYPE_CHECKING:
    import torch

    from mm_agent.convert.tensors import Scratch
    from mm_agent.convert.wan import Progress

# merge_lora_to_base's defaults in MindSpeed-MM (sora_model_converter.py)
DEFAULT_RANK = 8
DEFAULT_ALPHA = 16
ADAPTER = ".lora_{}.default.weight"  # PEFT's key of an adapter half (adapter name "default")
TABLE = f"mm_agent/convert/mappings/{CONVERTER}.yaml"


def _rules(mapping: Mapping) -> LoraRules:
    if mapping.lora is None:
        raise MMAgentError(
            f"the {mapping.converter} table declares no LoRA adapters",
            file=TABLE,
            field="lora",
            fix="add a lora:",
        )
    return mapping.lora


# ---------------------------------------------------------------------------------------------------------
# merge_lora_to_base


def _resolved(req: ConvertRequest) -> ConvertRequest:
    """Upstream's defaults filled in (the manifest and the mm-convert command spell them out)."""
    return req.model_copy(
        update={
            "lora_rank": DEFAULT_RANK if req.lora_rank is None else req.lora_rank,
            "lora_alpha": DEFAULT_ALPHA if req.lora_alpha is None else req.lora_alpha,
        }
    )


def _lora_source(req: ConvertRequest, base: MMCheckpoint) -> MMCheckpoint:
    """The LoRA checkpoint, checked against the request and the base's layout (no torch)."""
    if req.lora_path is None:
        raise MMAgentError(
            "merge_lora_to_base needs the LoRA checkpoint",
            field="lora_path",
            fix="pass --lora <the LoRA training's --save dir> (lora_path over MCP)",
        )
    if req.lora_rank == 0:
        raise MMAgentError(
            "LoRA rank can not be 0 (the scaling is alpha / rank)",
            file=req.lora_path,
            field="lora_rank",
            fix="pass the rank the LoRA was trained with (its --lora-r), e.g. --lora-rank 16",
        )
    if same_dir(req.lora_path, req.target):
        raise MMAgentError(
            "merge_lora_to_base cannot write into the LoRA checkpoint",
            field="target",
            fix="choose another --target",
        )
    lora = find_checkpoint(Path(req.lora_path), field="lora_path")
    if (lora.tp, lora.pp) != (base.tp, base.pp):
        raise MMAgentError(
            f"the LoRA checkpoint has TP={lora.tp} PP={lora.pp} rank files but the base {req.source} has "
            f"TP={base.tp} PP={base.pp}: they were not saved from the same layout",
            file=str(lora.root / lora.iteration),
            field="lora_path",
            fix="pass the base the LoRA was trained on, or resplit one to the other's layout first "
            "(mm-agent convert WanConverter resplit --pp-layers ...)",
        )
    return lora


def plan_merge(req: ConvertRequest) -> NativeLayout:
    req = _resolved(req)
    _mapping(req)
    base, manifest = _mm_source(req)
    lora = _lora_source(req, base)
    notes = []
    if manifest is not None and manifest.pp_layers:
        total = _sum(manifest.pp_layers)
    else:
        total = _sum(req.pp_layers) if req.pp_layers else 0
        notes.append("the base has no manifest: its layer count is checked when converting")
    split = parse_split(req.pp_layers, total)
    notes += target_notes(req, TRACKER, split.pp_layers)
    assert req.lora_rank is not None and req.lora_alpha is not None
    notes.append(
        f"merges {lora.root / lora.iteration} into {base.root / base.iteration} with scaling "
        f"lora_alpha / lora_rank = {req.lora_alpha} / {req.lora_rank}, written as {split.describe()}; "
        "rank and targets are checked when converting"
    )
    files = [
        RankFile(path=rank_file(0, split.pp_rank(s)), tp_rank=0, pp_rank=split.pp_rank(s), keys=0, bytes=0)
        for s in range(split.pp)
    ]
    size = _mm_bytes(base)
    return NativeLayout(
        files=files,
        source_bytes=size + _mm_bytes(lora),
        output_bytes=size,
        scratch_bytes=size,  # merged weights of one rank file at a time, at most the whole base
        notes=notes,
        resolved={"lora_rank": req.lora_rank, "lora_alpha": req.lora_alpha},
    )


def _check_args(req: ConvertRequest, lora: MMCheckpoint) -> None:
    """A training checkpoint records its `args`: a rank or alpha other than the request's is refused."""
    from mm_agent.convert.tensors import load_pt

    path = lora.stage_files()[0]
    args = load_pt(path).get("args")
    for saved, asked, flag in (
        ("lora_r", req.lora_rank, "--lora-rank"),
        ("lora_alpha", req.lora_alpha, "--lora-alpha"),
    ):
        value = getattr(args, saved, None)
        if isinstance(value, int) and value != asked:
            raise MMAgentError(
                f"the LoRA was trained with {saved}={value} (its saved args) but the merge asks for {asked}",
                file=str(path),
                field=flag.removeprefix("--").replace("-", "_"),
                fix=f"pass {flag} {value}",
            )


def adapters(
    lora: dict[str, torch.Tensor], rules: LoraRules, where: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """base module -> (A, B), by MindSpeed-MM's selection: names holding 'weight' and a target module, cut at
    '.lora_'. A module with only one half (which upstream skips silently) is refused."""
    modules = {
        n.split(".lora_")[0] for n in lora if "weight" in n and any(t in n for t in rules.target_modules)
    }
    out = {}
    for module in sorted(modules):
        a, b = lora.get(module + ADAPTER.format("A")), lora.get(module + ADAPTER.format("B"))
        if a is None and b is None:
            continue  # not an adapter (upstream skips it too)
        if a is None or b is None:
            missing = module + ADAPTER.format("A" if a is None else "B")
            raise MMAgentError(
                f"the LoRA checkpoint has no {missing!r} (half an adapter)",
                file=where,
                field="lora_path",
                fix="pass a complete LoRA checkpoint (every lora_A with its lora_B)",
            )
        out[module] = (a, b)
    if not out:
        raise MMAgentError(
            f"the LoRA checkpoint holds no '<module>{ADAPTER.format('A')}' adapters for the targets "
            f"{', '.join(rules.target_modules)}",
            file=where,
            field="lora_path",
            fix="pass a LoRA checkpoint saved by MindSpeed-MM's --lora-* training (or lora_hf_to_mm's output)",
        )
    return out


def _check_pairs(
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]],
    base: dict[str, torch.Tensor],
    req: ConvertRequest,
    where: str,
) -> None:
    for module, (a, b) in pairs.items():
        weight = base.get(module + ".weight")
        if weight is None:
            raise MMAgentError(
                f"the LoRA adapts {module!r} but the base {req.source} has no {module + '.weight'!r}",
                file=where,
                field="lora_path",
                fix="pass the base model the LoRA was trained on (same model size and layers)",
            )
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != req.lora_rank or b.shape[1] != req.lora_rank:
            raise MMAgentError(
                f"{module}: lora_A is {tuple(a.shape)} and lora_B {tuple(b.shape)}, not rank {req.lora_rank}",
                file=where,
                field="lora_rank",
                fix=f"pass the rank the LoRA was trained with: --lora-rank {a.shape[0]}",
            )
        if (b.shape[0], a.shape[1]) != tuple(weight.shape) or len({a.dtype, b.dtype, weight.dtype}) != 1:
            raise MMAgentError(
                f"{module}: B @ A is {b.shape[0]}x{a.shape[1]} {a.dtype}/{b.dtype} but the base weight is "
                f"{tuple(weight.shape)} {weight.dtype}",
                file=where,
                field="lora_path",
                fix="pass the base model the LoRA was trained on, in the dtype it was trained in",
            )


def merge_lora_to_base(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    from mm_agent.convert.mmio import load_merged

    req = _resolved(req)
    mapping = _mapping(req)
    rules = _rules(mapping)
    ckpt, manifest = _mm_source(req)
    lora_ckpt = _lora_source(req, ckpt)
    where = str(lora_ckpt.root / lora_ckpt.iteration)
    base, base_split = load_merged(ckpt, mapping.layer_prefix)
    lora, lora_split = load_merged(lora_ckpt, mapping.layer_prefix)
    if (lora_split.pp, lora_split.chunks, lora_split.vpp) != (
        base_split.pp,
        base_split.chunks,
        base_split.vpp,
    ):
        raise MMAgentError(
            f"the LoRA checkpoint is {lora_split.describe()} but the base is {base_split.describe()}",
            file=where,
            field="lora_path",
            fix="resplit one to the other's layout first (mm-agent convert WanConverter resplit --pp-layers ...)",
        )
    _check_args(req, lora_ckpt)
    pairs = adapters(lora, rules, where)
    _check_pairs(pairs, base, req, where)
    assert req.lora_rank is not None and req.lora_alpha is not None
    scaling = float(req.lora_alpha) / float(req.lora_rank)  # as upstream computes it
    targets = {module + ".weight": pair for module, pair in pairs.items()}
    names, split, placement, files = mm_layout(req.pp_layers, base, mapping)
    record = Record(
        req=req,
        direction="merge_lora_to_base",
        pp_layers=split.pp_layers,
        vpp=split.chunks if split.vpp else 1,
        key_count=len(names),
        files=files,
        source_root=Path(os.path.commonpath([ckpt.root, lora_ckpt.root])),
        source_files=_mm_files(ckpt) + _mm_files(lora_ckpt),
        hf=_hf_fields(manifest),
    )

    def tensor(name: str, scratch: Scratch) -> torch.Tensor:
        if name not in targets:
            return base[name]
        a, b = targets[name]
        merged = scratch.copy(base[name])
        merged.addmm_(
            b, a, alpha=scaling
        )  # MindSpeed-MM's lora_merge_to_base, the same op on the same values
        return merged

    return _write_mm(req, plan, record, split, placement, tensor, progress, [])


# ---------------------------------------------------------------------------------------------------------
# lora_hf_to_mm


class _LoraHFPlan:
    """lora_hf_to_mm from the headers: renamed keys, split, placement, files."""

    def __init__(self, req: ConvertRequest):
        mapping = _mapping(req)
        rules = _rules(mapping)
        self.source = read_hf_source(Path(req.source))
        self.kept: dict[str, str] = {}
        self.dropped: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for name in self.source.where:
            drop = next((d for d in mapping.drop if d.contains in name), None)
            if drop is not None:
                self.dropped[name] = drop
                continue
            mm = rules.hf_to_mm(name)
            if mm in seen:
                raise MMAgentError(
                    f"{seen[mm]!r} and {name!r} both become {mm!r}",
                    file=str(self.source.where[name][0].path),
                    field="source",
                    fix="the file mixes two namings of the same adapter: keep one",
                )
            seen[mm] = name
            self.kept[name] = mm
        if not any(
            ".lora_A." in mm and any(t in mm for t in rules.target_modules) for mm in self.kept.values()
        ):
            raise MMAgentError(
                f"no LoRA adapter (<module>.lora_A...) for the targets {', '.join(rules.target_modules)} in "
                f"{req.source}",
                field="source",
                fix="pass the dir of an HF/DiffSynth Wan LoRA safetensors file (keys like "
                "blocks.0.self_attn.q.lora_A.default.weight)",
            )
        self.split = parse_split(req.pp_layers, count_layers(list(self.kept.values()), mapping))
        self.placement = place(list(self.kept.values()), self.split, mapping)
        sizes = {mm: self.source.where[hf][1].nbytes for hf, mm in self.kept.items()}
        self.files = stage_files(self.placement, sizes, self.split)

    def record(self, req: ConvertRequest) -> Record:
        return Record(
            req=req,
            direction="lora_hf_to_mm",
            pp_layers=self.split.pp_layers,
            vpp=self.split.chunks if self.split.vpp else 1,
            key_count=len(self.kept),
            files=self.files,
            source_root=self.source.root,
            source_files=self.source.files(),
        )


def plan_lora_hf_to_mm(req: ConvertRequest) -> NativeLayout:
    hp = _LoraHFPlan(req)
    if same_dir(req.source, req.target):
        raise MMAgentError(
            "lora_hf_to_mm writes a LoRA checkpoint, not the in-place form",
            field="target",
            fix="choose another --target",
        )
    notes = [f"{len(hp.kept)} LoRA tensors renamed (no copies), {hp.split.describe()}"]
    if not any(ADAPTER.format("A") in mm for mm in hp.kept.values()):
        notes.append(
            f"the keys carry no PEFT adapter name ({ADAPTER.format('A')}): MindSpeed-MM's merge_lora_to_base "
            "and --load look for '.default.' keys"
        )
    notes += target_notes(req, TRACKER, hp.split.pp_layers)
    return NativeLayout(
        files=hp.files, source_bytes=hp.source.nbytes, output_bytes=hp.source.nbytes, notes=notes
    )


def lora_hf_to_mm(req: ConvertRequest, plan: ConvertPlan, progress: Progress) -> ConvertReport:
    hp = _LoraHFPlan(req)
    readers = _readers(hp.source)
    hf_of = {mm: hf for hf, mm in hp.kept.items()}

    def tensor(mm_name: str, scratch: Scratch) -> torch.Tensor:
        hf_name = hf_of[mm_name]
        return readers[hp.source.where[hf_name][0].path].get(hf_name)

    dropped: list[KeyChange] = _dropped(hp.dropped)
    return _write_mm(req, plan, hp.record(req), hp.split, hp.placement, tensor, progress, dropped)
