"""Converters mm-agent does not implement natively: MindSpeed-MM's own `mm-convert`, checked, then run.

The command comes from the registry's `ConverterSpec` through `pipeline.mm_convert_argv`, the builder the
pipeline and `render_job` use too, so it is exactly the upstream CLI of reference §2.1 (`--cfg.*` or flat
flags per converter, nested or flat pp lists per method). Before anything runs, the request gets the
checks mm-convert makes only after loading the whole model, or never: paths exist, the target holds no
checkpoint, pp lists are well formed and add up to the layer counts in config.json, tp divides the KV
heads. The run happens in the conversion worker (`run_upstream`): mm-convert's output is streamed into the
run log, its exit code decides the status and a failure is diagnosed with the log catalog. No torch here.
"""

from __future__ import annotations

import difflib
import json
import os
import resource
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from mm_agent.convert.layout import TRACKER, Split, find_checkpoint, parse_split, planned_files
from mm_agent.convert.manifest import (
    MANIFEST,
    hash_sources,
    now,
    read_manifest,
    source_stats,
    version,
    write_manifest,
)
from mm_agent.convert.schema import ConvertPlan, ConvertReport, ConvertRequest, Estimate, Manifest, RankFile
from mm_agent.errors import MMAgentError
from mm_agent.pipeline import ConvertRole, Layers, convert_role, is_vlm_converter, mm_convert_argv, vpp_chunks
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ConverterSpec
from mm_agent.units import human_bytes

MM_CONVERT = "mm-convert"
INSTALL_FIX = (
    "install MindSpeed-MM's converter into the environment mm-agent runs in: "
    "`cd MindSpeed-MM && pip install -e .` (it registers the `mm-convert` command)"
)
_WEIGHTS = (".safetensors", ".pt", ".bin", ".pth", ".distcp")
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Upstream:
    """A registry converter class as the request uses it."""

    spec: ConverterSpec
    vlm: bool
    role: ConvertRole
    init_args: dict[str, str]
    models: tuple[str, ...]


def find_converter(name: str, method: str, version: str | None = None) -> Upstream:
    """The registry's spec for converter class `name`, with the init args (`--version`) to use."""
    models = get_registry().models.values()
    entries = [e for e in models if e.converter is not None and e.converter.class_name == name]
    if not entries:
        known = sorted({e.converter.class_name for e in models if e.converter is not None})
        close = difflib.get_close_matches(name, known, n=3)
        raise MMAgentError(
            f"unknown converter {name!r}",
            field="converter",
            fix=(f"did you mean {', '.join(close)}? " if close else "") + f"known: {', '.join(known)}",
        )
    if version is not None:
        exact = [e for e in entries if e.converter and e.converter.init_args.get("version") == version]
        if not exact and not any(e.converter and "version" in e.converter.init_args for e in entries):
            raise MMAgentError(
                f"{name} takes no --version init argument",
                field="converter_version",
                fix="leave converter_version (--converter-version) out",
            )
        entries = exact or entries
    else:
        variants = {tuple(sorted(e.converter.init_args.items())) for e in entries if e.converter}
        if len(variants) > 1:
            shown = "; ".join(
                f"{', '.join(f'{k}={v}' for k, v in e.converter.init_args.items())} ({e.id})"
                for e in entries
                if e.converter
            )
            raise MMAgentError(
                f"{name} is used with different init arguments: {shown}",
                field="converter_version",
                fix="pass converter_version (CLI --converter-version) for the model you convert",
            )
    spec = entries[0].converter
    assert spec is not None
    init = dict(spec.init_args)
    if version is not None:
        init["version"] = version
    return Upstream(
        spec=spec,
        vlm=is_vlm_converter(entries[0]),
        role=convert_role(spec, method),
        init_args=init,
        models=tuple(e.id for e in entries),
    )


# ---------------------------------------------------------------------------------------------------------
# checks


def _dir(raw: str | None, field: str, what: str) -> Path:
    if raw is None:
        raise MMAgentError(f"{what} is required", field=field, fix=f"pass {what}")
    path = Path(raw)
    if not path.is_dir():
        raise MMAgentError(f"{raw} is not a directory", field=field, fix=f"pass the {what} (an existing dir)")
    return path


def _has_weights(path: Path, recursive: bool) -> bool:
    found = path.rglob("*.safetensors") if recursive else path.glob("*.safetensors")
    return next(iter(found), None) is not None


def _read_config(path: Path | None) -> dict[str, Any]:
    if path is None or not (path / "config.json").is_file():
        return {}
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MMAgentError(
            f"cannot read {path / 'config.json'}: {exc}",
            field="source",
            fix="restore the model's config.json",
        ) from None
    return data if isinstance(data, dict) else {}


def _first_int(config: dict[str, Any], *paths: str) -> int | None:
    for dotted in paths:
        node: Any = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, int) and not isinstance(node, bool):
            return node
    return None


def _vlm_counts(config: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(LLM layers, ViT layers, KV heads) from a VLM config.json (Qwen, InternVL, GLM spellings)."""
    llm = _first_int(
        config, "num_hidden_layers", "text_config.num_hidden_layers", "llm_config.num_hidden_layers"
    )
    vit = _first_int(config, "vision_config.depth", "vision_config.num_hidden_layers")
    kv = _first_int(
        config, "num_key_value_heads", "text_config.num_key_value_heads", "llm_config.num_key_value_heads"
    )
    return llm, vit, kv


def _split(values: Layers | None, total: int | None, field: str) -> Split | None:
    """Shape (and, when the model's layer count is known, sum) of a pp list, with layout's messages."""
    if not values:
        return None
    chunks = vpp_chunks(values)
    flat = [n for c in chunks for n in c] if chunks is not None else [v for v in values if isinstance(v, int)]
    return parse_split(values, total if total is not None else sum(flat), field)


def _check_target(req: ConvertRequest, conv: Upstream) -> list[str]:
    """mm-convert never checks its target: refuse one that holds a checkpoint already (sora hf_to_mm
    then dies with FileExistsError, the VLM writer mixes old and new rank files)."""
    target, source = Path(req.target), Path(req.source)
    if not target.exists():
        return []
    if not target.is_dir():
        raise MMAgentError(f"{target} exists and is not a directory", field="target", fix="pass a new dir")
    in_place = target.resolve() == source.resolve() and conv.role == "to_mm" and not conv.vlm
    if (target / TRACKER).exists() or (not in_place and any(target.iterdir())):
        raise MMAgentError(
            f"{target} is not empty" + (f" (it holds {TRACKER})" if (target / TRACKER).exists() else ""),
            field="target",
            fix="choose a new --target, or delete the old one first (mm-agent never overwrites)",
        )
    return ["in-place form: the MM layout is written next to the safetensors"] if in_place else []


def _check_parallel(req: ConvertRequest, conv: Upstream) -> tuple[Split | None, list[str], dict[str, Any]]:
    """Validate tp/pp lists for the converter's shape; returns the target split, notes and the argv extras."""
    notes: list[str] = []
    extra: dict[str, Any] = {}
    role = conv.role
    if role in ("flat_to_training", "flat_to_hf"):
        if req.tp != 1 or req.pp_layers or req.vit_pp_layers:
            raise MMAgentError(
                f"{conv.spec.class_name}.{req.method} writes or reads a DCP checkpoint, which is not split "
                "by TP/PP at conversion time (the training job shards it when loading)",
                field="pp_layers" if req.pp_layers else "tp",
                fix="drop --tp / --pp-layers / --vit-pp-layers",
            )
        return None, notes, extra
    if not conv.vlm:
        if req.vit_pp_layers:
            raise MMAgentError(
                f"vit_pp_layers is for VLM converters; {conv.spec.class_name} splits one DiT",
                field="vit_pp_layers",
                fix="pass the DiT split as --pp-layers only",
            )
        if role == "to_hf":
            if req.pp_layers or req.tp != 1:
                notes.append("mm_to_hf reads the split from the checkpoint: tp/pp_layers are not used")
            return None, notes, extra
        return _split(req.pp_layers, None, "pp_layers"), notes, extra
    return _check_vlm(req, conv, notes, extra)


def _check_vlm(
    req: ConvertRequest, conv: Upstream, notes: list[str], extra: dict[str, Any]
) -> tuple[Split | None, list[str], dict[str, Any]]:
    role = conv.role
    source = Path(req.source)
    manifest = read_manifest(source) if role in ("to_hf", "resplit") else None
    config = _read_config(source if role == "to_mm" else Path(req.hf_dir) if req.hf_dir else None)
    llm_n, vit_n, kv = _vlm_counts(config)
    llm, vit = req.pp_layers, req.vit_pp_layers
    if role == "to_mm":
        llm = llm or ([[llm_n]] if llm_n else None)
        vit = vit or ([[vit_n]] if vit_n else None)
    elif role == "to_hf" and manifest is not None and not llm:
        llm, vit = manifest.pp_layers, manifest.vit_pp_layers
        notes.append(f"split read from {source / MANIFEST}")
    if not llm or not vit:
        what = "the split the checkpoint was saved with" if role == "to_hf" else "the LLM and ViT split"
        raise MMAgentError(
            f"{conv.spec.class_name}.{req.method} needs {what}: llm_pp_layers and vit_pp_layers",
            field="pp_layers" if not llm else "vit_pp_layers",
            fix="pass --pp-layers (LLM layers per stage) and --vit-pp-layers (ViT layers per stage, ViT first), "
            "e.g. --pp-layers 12,16 --vit-pp-layers 32,0",
        )
    llm_split = _split(llm, llm_n if role != "resplit" else None, "pp_layers")
    vit_split = _split(vit, vit_n if role != "resplit" else None, "vit_pp_layers")
    assert llm_split is not None and vit_split is not None
    if vit_split.pp != llm_split.pp:
        notes.append(
            f"vit_pp_layers has {vit_split.pp} stages and pp_layers {llm_split.pp}: mm-convert warns "
            "'The pp_layers of vit and llm are inconsistent'"
        )
    if kv and req.tp > 1 and kv % req.tp:
        raise MMAgentError(
            f"tp {req.tp} does not divide num_key_value_heads {kv}",
            field="tp",
            fix=f"use a tp that divides {kv} (each rank needs whole KV heads)",
        )
    if role == "to_hf":
        found = find_checkpoint(source)
        if (found.tp, found.pp) != (req.tp, llm_split.pp):
            raise MMAgentError(
                f"{source} holds TP={found.tp} PP={found.pp} but the request says TP={req.tp} "
                f"PP={llm_split.pp}",
                field="tp" if found.tp != req.tp else "pp_layers",
                fix=f"pass --tp {found.tp} and the {found.pp}-stage split the checkpoint was saved with",
            )
        return None, notes, extra
    if role == "resplit":
        found = find_checkpoint(source)
        if manifest is None or manifest.pp_layers is None or manifest.vit_pp_layers is None:
            raise MMAgentError(
                f"{conv.spec.class_name}.resplit needs the split {source} was saved with, and it has no "
                f"{MANIFEST} recording it",
                field="source",
                fix="run mm-convert resplit by hand with --cfg.source_parallel_config.*, or convert the source "
                "with `mm-agent convert` (which records the split)",
            )
        src_llm = _split(manifest.pp_layers, None, "source pp_layers")
        src_vit = _split(manifest.vit_pp_layers, None, "source vit_pp_layers")
        assert src_llm is not None and src_vit is not None
        for name, old, new in (("pp_layers", src_llm, llm_split), ("vit_pp_layers", src_vit, vit_split)):
            if old.num_layers != new.num_layers:
                raise MMAgentError(
                    f"{name} sums to {new.num_layers} but the source holds {old.num_layers} layers "
                    "(mm-convert: 'pp layers not equal!')",
                    field=name,
                    fix=f"make {name} add up to {old.num_layers}",
                )
        extra.update(
            source_tp=req.source_tp or found.tp,
            source_pp_layers=manifest.pp_layers,
            source_vit_pp_layers=manifest.vit_pp_layers,
        )
    extra.update(pp_layers=llm, vit_pp_layers=vit)
    return llm_split, notes, extra


def _check_sources(req: ConvertRequest, conv: Upstream) -> None:
    role = conv.role
    source = _dir(req.source, "source", "source dir")
    if role in ("to_hf", "flat_to_hf"):
        _dir(req.hf_dir, "hf_dir", "original HF dir (--hf-dir; config and index files are copied from it)")
    if role in ("to_hf", "resplit") and not (source / TRACKER).is_file():
        raise MMAgentError(
            f"{source} has no {TRACKER}: not a Megatron checkpoint",
            field="source",
            fix="pass the training --save dir or an hf_to_mm target",
        )
    if role in ("to_mm", "flat_to_training") and not _has_weights(source, recursive=not conv.vlm):
        raise MMAgentError(
            f"no .safetensors files found in {source}",
            field="source",
            fix="pass the Hugging Face model dir (for diffusers pipelines its transformer/ folder)",
        )
    if conv.vlm and role == "to_mm" and not (source / "config.json").is_file():
        raise MMAgentError(f"no config.json in {source}", field="source", fix="pass the full HF model dir")


# ---------------------------------------------------------------------------------------------------------
# plan


def _weight_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        if p.suffix in _WEIGHTS and p.is_file():
            total += p.stat().st_size
    return total


def _free_disk(target: Path) -> int:
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _estimate(req: ConvertRequest, conv: Upstream) -> Estimate:
    """mm-convert holds the whole model in host memory and, to split it, a deep copy per TP rank
    (reference peers §5a: about (1+TP)x the checkpoint); merges hold every rank plus the merged copy."""
    source = _weight_bytes(Path(req.source))
    copies = {"to_mm": 1 + req.tp, "resplit": 1 + req.tp, "to_hf": 2}.get(conv.role, 1)
    peak = copies * source
    free_mem = psutil.virtual_memory().available
    free_disk = _free_disk(Path(req.target))
    reason = None
    if peak > free_mem:
        reason = (
            f"mm-convert needs about {human_bytes(peak)} of host memory ({copies}x the {human_bytes(source)} checkpoint: it "
            f"loads the whole model and copies it per TP rank) but {human_bytes(free_mem)} is available; free memory "
            "or convert on a bigger host"
        )
    elif source > free_disk:
        reason = f"the output needs about {human_bytes(source)} but {human_bytes(free_disk)} is free at {req.target}"
    return Estimate(
        source_bytes=source,
        output_bytes=source,
        peak_memory_bytes=peak,
        free_memory_bytes=free_mem,
        free_disk_bytes=free_disk,
        fits=reason is None,
        reason=reason,
    )


def plan_upstream(req: ConvertRequest) -> ConvertPlan:
    """The checked mm-convert command for a converter mm-agent does not implement (paths as given)."""
    conv = find_converter(req.converter, req.method, req.converter_version)
    if req.verify:
        raise MMAgentError(
            f"--verify compares weights with mm-agent's own converters; {req.converter} runs mm-convert",
            field="verify",
            fix="drop --verify (check the converted job with `mm-agent validate` instead)",
        )
    _check_sources(req, conv)
    notes = _check_target(req, conv)
    split, more, extra = _check_parallel(req, conv)
    notes += more
    argv = mm_convert_argv(
        conv.spec,
        req.method,
        vlm=conv.vlm,
        source=req.source,
        target=req.target,
        hf_dir=req.hf_dir,
        tp=req.tp,
        pp_layers=extra.get("pp_layers", req.pp_layers),
        vit_pp_layers=extra.get("vit_pp_layers", req.vit_pp_layers),
        source_tp=extra.get("source_tp"),
        source_pp_layers=extra.get("source_pp_layers"),
        source_vit_pp_layers=extra.get("source_vit_pp_layers"),
        init_args=conv.init_args,
    )
    writes_mm = conv.role in ("to_mm", "resplit") and conv.spec.target_format == "mm"
    notes.append(
        f"mm-agent has no native {req.converter}.{req.method}: it runs MindSpeed-MM's mm-convert "
        f"(models: {', '.join(conv.models)})"
    )
    if shutil.which(MM_CONVERT) is None:
        notes.append(f"{MM_CONVERT} is not on PATH here; {INSTALL_FIX}")
    return ConvertPlan(
        native=False,
        converter=req.converter,
        method=req.method,
        source=req.source,
        target=req.target,
        layout=planned_files(split, req.tp) if writes_mm else [],
        estimate=_estimate(req, conv),
        mm_convert_argv=argv,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------------------
# run (inside the conversion worker)


def _files(root: Path) -> dict[str, int]:
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _last_line(log: Path) -> str:
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _wrote(plan: ConvertPlan, conv: Upstream, target: Path) -> str | None:
    """What a finished mm-convert must have left, or None when it is there."""
    if plan.layout and not (target / TRACKER).is_file():
        return f"no {TRACKER} in {target}"
    if conv.role == "to_hf" and not _has_weights(target, recursive=False):
        return f"no .safetensors in {target}"
    if not target.is_dir() or not any(target.iterdir()):
        return f"{target} is empty"
    return None


def _count(path: Path) -> tuple[int, int]:
    """(tensors, tensor bytes) of a rank file, read back memory-mapped; (0, file size) if it won't load."""
    try:
        import torch

        data = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # any unreadable pickle: the file is still listed, by its size
        return 0, path.stat().st_size
    tensors = [
        v
        for k, sd in data.items()
        if isinstance(k, str) and k.startswith("model") and isinstance(sd, dict)
        for v in sd.values()
        if isinstance(v, torch.Tensor)
    ]
    return len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def _record(req: ConvertRequest, conv: Upstream, target: Path) -> Manifest:
    """The manifest of an MM layout mm-convert wrote, so validate_configs checks its split like a native one."""
    split, _, extra = _check_parallel(req, conv)
    found = find_checkpoint(target, field="target")
    files = []
    for (tp_rank, pp_rank), path in sorted(found.files.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        keys, nbytes = _count(path)
        rel = path.relative_to(target).as_posix()
        files.append(RankFile(path=rel, tp_rank=tp_rank, pp_rank=pp_rank, keys=keys, bytes=nbytes))
    source = Path(req.source)
    if conv.role == "resplit":
        inputs = [*find_checkpoint(source).files.values(), source / TRACKER]
    else:
        inputs = [*source.rglob("*.safetensors"), *(p for p in source.glob("*.json") if p.name != MANIFEST)]
    return Manifest(
        converter=req.converter,
        method=req.method,
        direction="resplit" if conv.role == "resplit" else "hf_to_mm",
        mm_agent_version=version(),
        source_files=hash_sources(source, inputs),
        source_mtimes={rel: mtime for rel, (_, mtime) in source_stats(source, inputs).items()},
        tp=req.tp,
        pp_layers=extra.get("pp_layers", req.pp_layers),
        vit_pp_layers=extra.get("vit_pp_layers", req.vit_pp_layers),
        vpp=split.chunks if split is not None and split.vpp else 1,
        key_count=sum(f.keys for f in files),
        files=files,
        created=now(),
    )


def _program(exe: str, argv: list[str]) -> list[str]:
    """The plan's command with its program resolved: `mm-convert` as found on PATH; the `python -c` form
    (a converter `mm-convert` cannot find, `pipeline.converter_program`) with the interpreter that
    mm-convert's own script names, so the same MindSpeed-MM install imports the module."""
    if argv[0] == MM_CONVERT:
        return [exe, *argv[1:]]
    with open(exe, "rb") as fh:
        first = fh.readline(4096).decode("utf-8", "replace")
    words = first[2:].split() if first.startswith("#!") else []
    python = words[0] if words and "python" in Path(words[0]).name else shutil.which("python3") or "python3"
    return [python, *argv[1:]]


def run_upstream(
    req: ConvertRequest, plan: ConvertPlan, log: Path, progress: Progress | None
) -> ConvertReport:
    """Run the plan's mm-convert command with its output appended to `log`; the report says how it ended."""
    from mm_agent.diagnose import diagnose_text
    from mm_agent.procs import spawn

    exe = shutil.which(MM_CONVERT)
    if exe is None:
        raise MMAgentError(f"{MM_CONVERT} is not on PATH", field="converter", fix=INSTALL_FIX)
    conv = find_converter(req.converter, req.method, req.converter_version)
    target = Path(req.target)
    before = _files(target)
    started = time.monotonic()
    with log.open("ab") as fh:
        fh.write(f"$ {shlex.join(plan.mm_convert_argv)}\n".encode())
        fh.flush()
        offset = fh.tell()
        proc = spawn(
            _program(exe, plan.mm_convert_argv),
            purpose=f"mm-convert {req.converter} {req.method}",
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        if progress is not None:
            progress(0, 1, f"mm-convert started (PID {proc.pid})")
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if progress is not None:
                    progress(0, 1, f"mm-convert: {_last_line(log)}")
    seconds = round(time.monotonic() - started, 2)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    after = _files(target)
    written = sum(size for name, size in after.items() if before.get(name) != size)
    common: dict[str, Any] = {"plan": plan, "seconds": seconds, "peak_rss_bytes": peak}
    if code != 0:
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", "replace")
        cause = diagnose_text(text, name=MM_CONVERT).root_cause
        why = (
            f"; diagnosis: {cause.title}: {cause.cause} fix: {cause.fixes[0].text}"
            if cause is not None
            else "; no known failure signature: read the log tail"
        )
        return ConvertReport(status="failed", message=f"mm-convert exited with {code}{why}", **common)
    missing = _wrote(plan, conv, target)
    if missing is not None:
        return ConvertReport(
            status="failed", message=f"mm-convert exited 0 but wrote nothing usable: {missing}", **common
        )
    new = sum(1 for name, size in after.items() if before.get(name) != size)
    message = f"mm-convert wrote {new} file(s), {human_bytes(written)} into {target}"
    files: list[RankFile] = []
    if plan.layout:  # an MM layout: record its split like a native conversion does
        if progress is not None:
            progress(0, 1, "recording the conversion manifest")
        manifest = _record(req, conv, target)
        write_manifest(target, manifest)
        files = manifest.files
        message += f"; split recorded in {MANIFEST}"
    if progress is not None:
        progress(1, 1, "mm-convert finished")
    return ConvertReport(
        status="converted",
        message=message,
        bytes_written=written,
        files=files,
        keys_converted=sum(f.keys for f in files),
        **common,
    )
