"""A conversion planned before its weights are downloaded: from the registry, not from the files.

Why: an assistant plans the whole pipeline before anything is fetched, and `convert_weights` used to answer a
dry run on a missing source with "Directory not found". The registry already knows what a to-training
conversion will be: the converter class and method, the models it serves, each size's Hugging Face repo and
layer counts (so the rank files the TP/PP layout writes, and a pp list that cannot add up is refused now),
and the equivalent mm-convert command. What only the files can tell (tensor keys and bytes, the memory/disk
estimate) is left out and said to come once the download is there; the download is the first step named.
No torch, no file reads beyond `Path.exists`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from mm_agent.convert.layout import Split, parse_split, planned_files
from mm_agent.convert.mapping import MAPPINGS_DIR, load_mapping
from mm_agent.convert.schema import ConvertPlan, ConvertRequest
from mm_agent.errors import MMAgentError
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry, SizeSpec


@dataclass(frozen=True)
class Download:
    """The repo the source path names, where it goes, and the registry size it is."""

    entry: ModelEntry
    size: SizeSpec
    hf_id: str
    local_dir: Path

    @property
    def command(self) -> str:
        return shlex.join(["huggingface-cli", "download", self.hf_id, "--local-dir", str(self.local_dir)])


def _is_download(req: ConvertRequest) -> bool:
    """Whether the request's source is what a download provides: the to-training method's input."""
    from mm_agent.convert.upstream import find_converter

    conv = find_converter(req.converter, req.method, req.converter_version)
    return conv.spec.to_training == req.method and req.method in conv.spec.methods


def find_download(req: ConvertRequest) -> Download | None:
    """The registry repo whose name is a folder of the source path (`.../Wan2.1-T2V-1.3B-Diffusers/
    transformer`, `.../Qwen2.5-VL-3B-Instruct`) among the models this converter serves, or None."""
    source = Path(req.source)
    parts = [p.lower() for p in source.parts]
    for entry in get_registry().models.values():
        if entry.converter is None or entry.converter.class_name != req.converter:
            continue
        for size in entry.sizes:
            for hf_id in size.hf_ids:
                name = hf_id.split("/")[-1].lower()
                if name in parts:
                    at = len(parts) - 1 - parts[::-1].index(name)
                    return Download(entry, size, hf_id, Path(*source.parts[: at + 1]))
    return None


def missing_download(req: ConvertRequest) -> bool:
    """A to-training conversion whose source is not there yet."""
    return not Path(req.source).exists() and _is_download(req)


def download_fix(req: ConvertRequest) -> str:
    """What to run first when the source of a to-training conversion is missing."""
    found = find_download(req)
    if found is not None:
        return f"download the weights first: {found.command}; then convert again"
    models = _models(req.converter)
    repos = [h for e in models for s in e.sizes for h in s.hf_ids][:4]
    return (
        f"download the Hugging Face weights first (e.g. huggingface-cli download {repos[0]} --local-dir <dir>) "
        f"and pass that folder as source{' (a Wan diffusers repo: its transformer/ folder)' if req.converter == 'WanConverter' else ''}; "
        f"{req.converter} serves {', '.join(e.id for e in models)}"
        if repos
        else "download the Hugging Face weights first and pass that folder as source"
    )


def _models(converter: str) -> list[ModelEntry]:
    return [e for e in get_registry().models.values() if e.converter and e.converter.class_name == converter]


def _layers(size: SizeSpec | None, vlm: bool) -> int | None:
    """The layer count the pp list must add up to: the size's transformer layers, or its LLM layers (VLM)."""
    if size is None:
        return None
    if vlm:
        llm = size.parallel.llm_pp_layers
        return sum(llm) if llm else None
    count = size.arch.get("num_layers")
    return count if isinstance(count, int) else None


def _split(req: ConvertRequest, layers: int | None) -> Split | None:
    """The request's PP/VPP split, checked against the registry's layer count when it is known."""
    if layers is not None:
        return parse_split(req.pp_layers, layers)
    if not req.pp_layers:
        return None
    nested = isinstance(req.pp_layers[0], list)
    flat = [sum(c) for c in req.pp_layers] if nested else req.pp_layers  # type: ignore[arg-type]
    return parse_split(req.pp_layers, sum(flat))  # type: ignore[arg-type]


def plan_before_download(req: ConvertRequest) -> ConvertPlan:
    """The dry-run plan of a to-training conversion whose source is not downloaded yet (see the module)."""
    from mm_agent.convert.plan import is_native
    from mm_agent.convert.upstream import find_converter
    from mm_agent.pipeline import mm_convert_argv

    conv = find_converter(req.converter, req.method, req.converter_version)
    # the converter's own TP rule (data, no files read)
    if (MAPPINGS_DIR / f"{req.converter}.yaml").is_file():
        load_mapping(req.converter).check_tp(req.tp)
    found = find_download(req)
    size = found.size if found is not None else None
    split = _split(req, _layers(size, conv.vlm))
    if split is not None and found is None:  # no size named: the split must fit one the converter serves
        counts = sorted({n for e in _models(req.converter) for s in e.sizes if (n := _layers(s, conv.vlm))})
        if counts and split.num_layers not in counts:
            raise MMAgentError(
                f"pp_layers add up to {split.num_layers} layers, but the models {req.converter} serves have "
                f"{', '.join(map(str, counts))}",
                field="pp_layers",
                fix="make the counts add up to the model's layers (e.g. "
                f"{counts[0]} in {min(split.pp, counts[0])} stages), or leave pp_layers out",
            )
    pp_layers = req.pp_layers
    vit_pp_layers = req.vit_pp_layers
    if conv.vlm and pp_layers is None and size is not None:  # the size's stock split, as render_job passes it
        pp_layers, vit_pp_layers = size.parallel.llm_pp_layers, size.parallel.vit_pp_layers
    argv = mm_convert_argv(
        conv.spec,
        req.method,
        vlm=conv.vlm,
        source=req.source,
        target=req.target,
        hf_dir=req.hf_dir,
        tp=req.tp,
        pp_layers=pp_layers,
        vit_pp_layers=vit_pp_layers,
        init_args=conv.init_args,
    )
    if found is not None:
        what = f"{found.entry.name} {found.size.id} ({found.hf_id})"
        first = f"download first: {found.command}"
    else:
        models = _models(req.converter)
        what = f"one of {', '.join(e.id for e in models)}"
        first = download_fix(req)
    layers = _layers(size, conv.vlm)
    notes = [
        f"{req.source} is not there yet: {first}",
        f"planned from the registry: {req.converter}.{req.method} of {what}"
        + (f", {layers} {'LLM ' if conv.vlm else ''}layers" if layers else "")
        + f", TP {req.tp}"
        + (f", {split.describe()}" if split is not None else ""),
        "tensor keys and bytes, and the memory/disk estimate, are read from the weights: run this dry run "
        "again once they are downloaded",
    ]
    return ConvertPlan(
        native=is_native(req),
        converter=req.converter,
        method=req.method,
        source=req.source,
        target=req.target,
        layout=planned_files(split, req.tp, layer_ids=not conv.vlm),
        estimate=None,
        mm_convert_argv=argv,
        notes=notes,
        download=found.command if found is not None else None,
    )


def refuse_missing(req: ConvertRequest) -> None:
    """A confirmed to-training conversion of weights not downloaded yet: say the download, not the folder."""
    if missing_download(req):
        raise MMAgentError(
            f"source {req.source} is not there: the weights are not downloaded yet",
            field="source",
            fix=download_fix(req),
        )
