"""`plan_conversion`: what a conversion will write and need, before anything is written (the dry run).

Native converters (`NATIVE`) are planned by their module (`plan(req) -> NativeLayout`, importable without
torch: the MCP server plans conversions), which validates the request and computes the exact layout from
safetensors headers; other converters are planned as MindSpeed-MM's own mm-convert command
(`upstream.plan_upstream`). The estimate refuses a conversion the machine cannot hold before it starts.
"""

from __future__ import annotations

import importlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from mm_agent.convert.schema import ConvertPlan, ConvertRequest, Estimate, RankFile
from mm_agent.errors import MMAgentError
from mm_agent.paths import confine
from mm_agent.units import human_bytes

# converter -> methods mm-agent converts itself; module that implements them (see NativeLayout).
NATIVE: dict[str, frozenset[str]] = {
    "WanConverter": frozenset({"hf_to_mm", "mm_to_hf", "resplit", "merge_lora_to_base", "lora_hf_to_mm"}),
    "Qwen2_5_VLConverter": frozenset({"hf_to_mm", "mm_to_hf"}),
}
MODULES: dict[str, str] = {
    "WanConverter": "mm_agent.convert.wan",
    "Qwen2_5_VLConverter": "mm_agent.convert.qwen2_5_vl",
}
# Anonymous memory of the conversion process itself (interpreter + torch + pickling), with headroom: a
# 2.8 GB Wan2.1-1.3B-shaped bf16 checkpoint peaked at 186 MB RssAnon for hf_to_mm (PP=1 and PP=4) and
# mm_to_hf alike. Converters add what they materialise beyond it (NativeLayout.extra_memory_bytes).
BASE_PEAK_BYTES = 384 * 1024 * 1024
LORA_METHODS = frozenset({"merge_lora_to_base", "lora_hf_to_mm"})


@dataclass
class NativeLayout:
    """A native converter's plan: the files it writes and the resources it needs beyond the base."""

    files: list[RankFile]
    source_bytes: int
    output_bytes: int
    extra_memory_bytes: int = 0  # anonymous memory beyond BASE_PEAK_BYTES (0 for pure renames)
    scratch_bytes: int = 0  # file-backed scratch in the temp dir (disk)
    notes: list[str] = field(default_factory=list)
    # request fields the converter resolved (defaults, or tp/pp read from the checkpoint), so the equivalent
    # mm-convert command spells them out as upstream requires (VLM converters need both pp lists)
    resolved: dict[str, Any] = field(default_factory=dict)


def is_native(req: ConvertRequest) -> bool:
    return req.method in NATIVE.get(req.converter, frozenset())


def converter_module(converter: str) -> ModuleType:
    """The module implementing a native converter; it must not import torch at module level."""
    return importlib.import_module(MODULES[converter])


def confine_request(req: ConvertRequest, root: Path) -> ConvertRequest:
    """Paths resolved inside the workspace (MCP); absolute, so the worker does not depend on its cwd."""
    update = {"source": str(confine(req.source, root)), "target": str(confine(req.target, root))}
    for name in ("hf_dir", "lora_path"):
        raw = getattr(req, name)
        if raw is not None:
            update[name] = str(confine(raw, root))
    return req.model_copy(update=update)


def plan_conversion(req: ConvertRequest, root: Path | None = None) -> ConvertPlan:
    """Validate the request and describe the conversion; MMAgentError (field + fix) for bad input."""
    from mm_agent.convert.upstream import find_converter, plan_upstream
    from mm_agent.pipeline import mm_convert_argv

    if root is not None:
        req = confine_request(req, root)
    _lora_fields_only_for_merge(req)
    if not is_native(req):
        return plan_upstream(req)
    layout: NativeLayout = converter_module(req.converter).plan(req)
    # LoRA methods take resplit's --cfg shape plus their own arguments (added below); the shared command
    # builder knows only the plain conversion methods
    lora = req.method in LORA_METHODS
    conv = find_converter(req.converter, "resplit" if lora else req.method, req.converter_version)
    if req.method not in conv.spec.methods:
        raise MMAgentError(
            f"the registry lists no {req.method} for {req.converter}",
            field="method",
            fix=f"use one of: {', '.join(conv.spec.methods)}",
        )
    full = req.model_copy(update=layout.resolved)
    argv = mm_convert_argv(
        conv.spec,
        "resplit" if lora else req.method,
        vlm=conv.vlm,
        source=req.source,
        target=req.target,
        hf_dir=req.hf_dir,
        tp=full.tp,
        pp_layers=full.pp_layers,
        vit_pp_layers=full.vit_pp_layers,
        init_args=conv.init_args,
    )
    if lora:
        argv = _lora_argv(argv, req.method, len(conv.init_args), full)
    return ConvertPlan(
        native=True,
        converter=req.converter,
        method=req.method,
        source=req.source,
        target=req.target,
        layout=layout.files,
        estimate=estimate(layout, Path(req.target)),
        mm_convert_argv=argv,
        notes=layout.notes,
    )


def _lora_fields_only_for_merge(req: ConvertRequest) -> None:
    given = [f for f in ("lora_path", "lora_rank", "lora_alpha") if getattr(req, f) is not None]
    if given and req.method != "merge_lora_to_base":
        raise MMAgentError(
            f"{', '.join(given)} only apply to merge_lora_to_base, not {req.method}",
            field=given[0],
            fix=f"leave {', '.join(given)} out, or convert with method merge_lora_to_base",
        )


def _lora_argv(argv: list[str], method: str, init_args: int, req: ConvertRequest) -> list[str]:
    """`mm-convert <Class> <method> --cfg...` of a LoRA method: the method name in place, and
    merge_lora_to_base's own arguments (`--cfg.lora_path`, `--lora_rank`, `--lora_alpha`, as its README)."""
    at = 2 + 2 * init_args  # mm-convert <Class> [--key value]... <method>
    out = [*argv[:at], method, *argv[at + 1 :]]
    if method == "merge_lora_to_base":
        out += ["--cfg.lora_path", str(req.lora_path), "--lora_rank", str(req.lora_rank)]
        out += ["--lora_alpha", str(req.lora_alpha)]
    return out


def _free_disk(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def estimate(layout: NativeLayout, target: Path) -> Estimate:
    """Peak anonymous memory and disk against what the machine has; `reason` says what to free."""
    peak = BASE_PEAK_BYTES + layout.extra_memory_bytes
    disk = layout.output_bytes + layout.scratch_bytes
    free_mem = psutil.virtual_memory().available
    free_disk = _free_disk(target)
    reason = None
    if peak > free_mem:
        reason = (
            f"the conversion needs about {human_bytes(peak)} of host memory but {human_bytes(free_mem)} is available; "
            "stop other processes or convert on a bigger host"
        )
    elif disk > free_disk:
        reason = (
            f"the output needs {human_bytes(disk)} but {human_bytes(free_disk)} is free where {target} is written; "
            "free disk space or choose another --target"
        )
    return Estimate(
        source_bytes=layout.source_bytes,
        output_bytes=layout.output_bytes,
        peak_memory_bytes=peak,
        free_memory_bytes=free_mem,
        free_disk_bytes=free_disk,
        fits=reason is None,
        reason=reason,
    )


def require_fit(plan: ConvertPlan) -> None:
    """Refuse to start a conversion the estimate says cannot finish."""
    if plan.estimate is not None and not plan.estimate.fits:
        raise MMAgentError(
            plan.estimate.reason or "not enough resources",
            field="target",
            fix="free memory/disk as described, or convert on another machine",
        )
