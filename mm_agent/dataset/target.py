"""What a dataset is checked against: the dataset config of the job it feeds.

With `job_dir`, the job's own files; otherwise the files `render_job` would write for the model, task and size
(a dry run, nothing written), so prepare_dataset and the job agree by construction. The config that reads raw
clips (`data_storage_mode: combine`, e.g. Wan's `feature_extract/data.json`) gives the clip limits; one with an
`attr` block (a VLM's data config) gives the MLLM record shape. The extraction script gives the global batch
size of MindSpeed-MM's final sample-size filter.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mm_agent import yamlload
from mm_agent.dataset.formats import ReaderFormat, reader_format
from mm_agent.dataset.limits import OPENSORAPLAN, ClipLimits, limits_from_config
from mm_agent.dataset.schema import DatasetRequest, IndexKind
from mm_agent.errors import MMAgentError
from mm_agent.paths import confine, read_file, resolve

_INT = {
    "npus": re.compile(r"^NPUS_PER_NODE=\"?\$?\{?[A-Z_]*:?-?(\d+)", re.M),
    "nnodes": re.compile(r"^NNODES=\"?\$?\{?[A-Z_]*:?-?(\d+)", re.M),
    "mbs": re.compile(r"^MBS=(\d+)", re.M),
    "cp": re.compile(r"^CP=(\d+)", re.M),
}
_IMAGE_TASKS = {"t2i", "i2i"}


@dataclass
class Target:
    kind: IndexKind
    model: str
    task: str
    runtime: str
    limits: ClipLimits | None = None
    data_config: dict[str, Any] = field(default_factory=dict)
    config_file: str = ""
    job_dir: str | None = None
    reader: ReaderFormat | None = None  # what the job's dataset class reads (None: a model the table lacks)
    # MindSpeed-MM's feature extraction of the job: (data-parallel ranks, micro batch, dataloader_param)
    extraction: tuple[int, int, dict[str, Any]] | None = None


def _extraction_layout(script: str) -> tuple[int, int] | None:
    """(data-parallel ranks NPUS_PER_NODE x NNODES / CP, MBS) of a rendered extraction script."""
    found = {k: int(m.group(1)) for k, rx in _INT.items() if (m := rx.search(script))}
    if "npus" not in found:
        return None
    return max(1, found["npus"] * found.get("nnodes", 1) // max(found.get("cp", 1), 1)), found.get("mbs", 1)


def _extraction_gbs(script: str) -> int | None:
    """NPUS_PER_NODE x NNODES x MBS / CP of a rendered extraction script (its --global-batch-size)."""
    layout = _extraction_layout(script)
    return None if layout is None else max(1, layout[0] * layout[1])


def _data_config(rel: str, text: str) -> dict[str, Any] | None:
    """A job file's data config as `{"dataset_param": ...}`: a JSON data config, or the `data:` block of a YAML
    training config (transformers / fsdp2-native VLMs); None for anything else."""
    try:
        if rel.endswith(".json"):
            cfg = json.loads(text)
        elif rel.endswith((".yaml", ".yml")) and rel != "job.yaml":
            cfg = yamlload.safe_load(text)
            cfg = cfg.get("data") if isinstance(cfg, dict) and isinstance(cfg.get("data"), dict) else cfg
        else:
            return None
    except (ValueError, yaml.YAMLError, yamlload.YAMLLimit):
        return None
    return cfg if isinstance(cfg, dict) and isinstance(cfg.get("dataset_param"), dict) else None


def _from_files(
    files: dict[str, str],
    model: str,
    task: str,
    runtime: str,
    source: str,
    req: DatasetRequest,
    reader: ReaderFormat | None = None,
) -> Target:
    """The job's config that reads the raw items: the one in the storage mode the model's reader reads
    (`combine`, or `standard` for CogVideoX/Step-Video), or the VLM config with an `attr` block."""
    if reader is not None and reader.format is None:
        assert reader.entry.unsupported is not None
        raise MMAgentError(
            f"{model} {task}: mm-agent does not write this dataset: {reader.entry.unsupported.reason}",
            field="model",
            fix=reader.entry.unsupported.fix,
        )
    mode = reader.format.storage_mode if reader is not None and reader.format else "combine"
    raw_cfg: tuple[str, dict[str, Any]] | None = None
    vlm_cfg: tuple[str, dict[str, Any]] | None = None
    for rel, text in sorted(files.items()):
        cfg = _data_config(rel, text)
        if cfg is None:
            continue
        ds = cfg["dataset_param"]
        if isinstance(ds.get("attr"), dict) and vlm_cfg is None:
            vlm_cfg = (rel, cfg)
        basic = ds.get("basic_parameters", {})
        stored = basic.get("data_storage_mode", "standard") if isinstance(basic, dict) else None
        raw = ds.get("dataset_type") in ("t2v", "i2v")  # (a feature config is "standard" by default too)
        if raw and stored == mode and raw_cfg is None:
            raw_cfg = (rel, cfg)
    if vlm_cfg is not None and (reader is None or reader.format_id == "mllm"):
        return Target("mllm", model, task, runtime, None, vlm_cfg[1], f"{source}/{vlm_cfg[0]}", reader=reader)
    if raw_cfg is None:
        raise MMAgentError(
            f"{model} {task}: no dataset config that reads raw clips or MLLM records in {source}",
            field="model",
            fix="prepare_dataset knows the video-text formats (`data_storage_mode: combine` for Wan, HunyuanVideo, "
            "...; `standard` data.jsonl for CogVideoX and Step-Video) and the MLLM format (VLMs with an `attr` "
            "block); write this model's index by hand",
        )
    rel, cfg = raw_cfg
    script = next((t for r, t in files.items() if r.endswith(".sh") and "extract" in r), "")
    gbs = _extraction_gbs(script) if runtime == "mindspeed-mm" else None
    limits = limits_from_config(
        cfg,
        source=f"{source}/{rel}",
        global_batch_size=gbs,
        num_frames=req.num_frames,
        frame_interval=req.frame_interval,
        max_height=req.max_height,
        max_width=req.max_width,
        text_len=req.text_len,
    )
    if limits.processor == OPENSORAPLAN and limits.frame_interval != 1:
        raise MMAgentError(
            f"frame_interval {limits.frame_interval} with {OPENSORAPLAN}: it selects clips by num_frames x "
            "frame_interval but then samples num_frames consecutive frames, and fails on the mismatch",
            file=f"{source}/{rel}" if req.frame_interval is None else None,
            field="frame_interval",
            fix="leave frame_interval at 1; to resample a high frame rate set auto_interval and train_fps",
        )
    kind: IndexKind = "image-text" if task in _IMAGE_TASKS else "video-text"
    layout = _extraction_layout(script) if runtime == "mindspeed-mm" and script else None
    loader = cfg.get("dataloader_param")
    extraction = (*layout, loader if isinstance(loader, dict) else {}) if layout is not None else None
    return Target(
        kind, model, task, runtime, limits, cfg, f"{source}/{rel}", reader=reader, extraction=extraction
    )


def _job_files(job: Path, root: Path | None) -> dict[str, str]:
    files: dict[str, str] = {}
    for path in sorted([*job.glob("*"), *job.glob("*/*")]):
        if path.suffix in (".json", ".sh", ".yaml") and path.is_file() and not path.is_symlink():
            files[str(path.relative_to(job))] = read_file(path, root, "job_dir", limit=4 << 20).decode(
                "utf-8", "replace"
            )
    return files


def _job_spec(text: str, path: Path) -> dict[str, Any]:
    """The fields of a job's job.yaml, read by the bounded loader (an alias bomb there is refused, not
    expanded by `str()` of a field); unreadable YAML or a non-mapping is an error naming the file."""
    try:
        spec = yamlload.safe_load(text) or {}
    except yamlload.YAMLLimit as exc:
        raise MMAgentError(f"cannot read job spec: {exc.message}", file=str(path), fix=exc.fix) from None
    except yaml.YAMLError as exc:
        raise MMAgentError(
            f"cannot read job spec: {exc}", file=str(path), fix="pass the job.yaml of a rendered job"
        ) from None
    if not isinstance(spec, dict):
        raise MMAgentError(
            "job spec is not a mapping of fields", file=str(path), fix="pass the job.yaml of a rendered job"
        )
    return spec


def _reader(model: str, task: str, version: str | None, backend: str | None) -> ReaderFormat | None:
    """The model's reader at the job's version (the registry default when the job names none); None when the
    model or task is not in the table (the configs alone then decide, as before)."""
    from mm_agent.registry import get_registry

    reg = get_registry()
    try:
        entry = reg.get(model)
        if backend is None:
            backend = next((t.backend for t in entry.tasks if t.id == task), None)
        return reader_format(model, task, version or reg.versions.default, backend)
    except MMAgentError:
        return None


def resolve_target(req: DatasetRequest, base: Path, root: Path | None) -> Target:
    if req.job_dir:
        job = confine(req.job_dir, root, "job_dir") if root else resolve(base / req.job_dir, "job_dir")
        files = _job_files(job, root)
        if "job.yaml" not in files:
            raise MMAgentError(
                f"{job} holds no job.yaml",
                field="job_dir",
                fix="pass a directory written by render_job (mm-agent render ...), or leave job_dir out",
            )
        job_spec = _job_spec(files["job.yaml"], job / "job.yaml")
        model, task = str(job_spec.get("model", req.model)), str(job_spec.get("task", req.task or ""))
        if model != req.model:
            raise MMAgentError(
                f"the job renders {model}, not {req.model}",
                field="model",
                fix=f"pass model={model}, or the job of {req.model}",
            )
        version, backend = job_spec.get("mm_version"), job_spec.get("backend")
        reader = _reader(model, task, str(version) if version else None, str(backend) if backend else None)
        runtime = str(job_spec.get("runtime", "mindspeed-mm"))
        target = _from_files(files, model, task, runtime, str(job), req, reader)
        target.job_dir = str(job)
        return target
    from mm_agent.render import RenderRequest, render_job  # render pulls in the templates; only here

    with tempfile.TemporaryDirectory(prefix="mm-dataset-") as tmp:
        spec_args: dict[str, Any] = {"model": req.model, "out_dir": str(Path(tmp) / "job")}
        for name in (
            "task",
            "size",
            "mm_version",
            "runtime",
            "num_frames",
            "max_height",
            "max_width",
            "text_len",
        ):
            if getattr(req, name) is not None:
                spec_args[name] = getattr(req, name)
        from mm_agent.registry import get_registry

        entry = get_registry().get(req.model)  # (an unknown id: its own error)
        if "task" not in spec_args:
            spec_args["task"] = entry.tasks[0].id
        if entry.user is not None:
            # a scaffolded model's dataset class reads the same {path, cap} records and clip limits as the
            # bundled job's raw-clip config, which states those limits in MindSpeed-MM's own keys
            spec_args["runtime"] = "bundled"
        try:
            spec = RenderRequest(**spec_args)
        except ValidationError as exc:  # a value the job renderer refuses: named as this tool's field
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise MMAgentError(err["msg"], field=where, fix=f"correct {where} (see list_models)") from None
        rendered = render_job(spec, root=None)
    files = {f.path: f.content or "" for f in rendered.files}
    reader = _reader(rendered.model, rendered.task, rendered.mm_version, rendered.backend)
    return _from_files(
        files, rendered.model, rendered.task, rendered.runtime, "render_job defaults", req, reader
    )
