"""A rendered job as an estimate request: job.yaml for the model, size, task, layout and input shape, and the
rendered scripts and data configs for what the templates decided (LayerZero or FSDP2, recompute, LoRA, the
parallel sizes and the clip shape the data loader will produce). Request fields that are set win."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.estimate.profiles import Runtime
from mm_agent.estimate.schema import EstimateRequest
from mm_agent.jobfile import JOB_FILE, load_job_spec
from mm_agent.paths import read_file

MAX_CONFIG = 1024 * 1024
_ASSIGN = re.compile(r"^(TP|CP|NPUS_PER_NODE)=(\d+)\s*$", re.MULTILINE)
_SHAPE_KEYS = {"num_frames": "frames", "max_height": "height", "max_width": "width"}


def _scripts(job_dir: Path, root: Path | None) -> str:
    """The training launch script's text (the one with --train-iters), or ''."""
    for path in sorted(p for p in job_dir.glob("*.sh") if not p.name.startswith("inference")):
        text = read_file(path, root, field="job_dir", limit=MAX_CONFIG).decode("utf-8", "replace")
        if "--train-iters" in text:
            return text
    return ""


def _find_shape(value: Any, out: dict[str, int]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _SHAPE_KEYS and isinstance(item, int) and _SHAPE_KEYS[key] not in out:
                out[_SHAPE_KEYS[key]] = item
            else:
                _find_shape(item, out)
    elif isinstance(value, list):
        for item in value:
            _find_shape(item, out)


def _data_shape(job_dir: Path, root: Path | None) -> dict[str, int]:
    """num_frames / max_height / max_width of the training data config (feature_data.json, data.json)."""
    out: dict[str, int] = {}
    for name in ("feature_data.json", "data.json"):
        path = job_dir / name
        if path.is_file():
            try:
                _find_shape(json.loads(read_file(path, root, field="job_dir", limit=MAX_CONFIG)), out)
            except ValueError:
                continue  # validate_configs reports a broken config; the estimate keeps the stock shape
    return out


def request_from_job(req: EstimateRequest, root: Path | None) -> tuple[EstimateRequest, Runtime]:
    """The request with the job's values filled in, and the runtime the job renders for."""
    job_dir = Path(req.job_dir or ".").expanduser()
    if root is not None and not job_dir.is_absolute():
        job_dir = root / job_dir
    if not (job_dir / JOB_FILE).is_file():
        raise MMAgentError(
            f"{job_dir} holds no {JOB_FILE}", field="job_dir", fix="pass a directory written by render_job"
        )
    spec = load_job_spec(job_dir / JOB_FILE, root)
    script = _scripts(job_dir, root)
    values: dict[str, Any] = {
        "model": spec.model,
        "size": spec.size,
        "task": spec.task,
        "tp": spec.tp,
        "cp": spec.cp,
        "frames": spec.num_frames,
        "height": spec.max_height,
        "width": spec.max_width,
        "text_len": spec.text_len,
        "train_iters": spec.train_iters,
        "recompute": "full" if spec.recompute else "none",
        "device": "cpu" if spec.device == "cpu" else None,  # npu/cuda/auto: which card is not in the job
    }
    assigned = {name: int(value) for name, value in _ASSIGN.findall(script)}
    for name in ("TP", "CP"):
        if values[name.lower()] is None and name in assigned:
            values[name.lower()] = assigned[name]
    per_node = spec.npus_per_node or assigned.get("NPUS_PER_NODE")
    if per_node:
        values["npus"] = per_node * (spec.nnodes or 1)
    if script:
        values["recompute"] = "full" if "--recompute-granularity full" in script else "none"
        values["lora"] = "--lora-target-modules" in script
        if "--layerzero" in script:
            values["sharding"] = "layerzero"
        elif "--use-torch-fsdp2" in script:
            values["sharding"] = "fsdp2"
        elif "--use-distributed-optimizer" in script:
            values["sharding"] = "distributed-optimizer"
    for key, value in _data_shape(job_dir, root).items():
        values[key] = values[key] or value
    given = req.model_dump(exclude_none=True, exclude={"job_dir"})
    filled = EstimateRequest.model_validate({k: v for k, v in values.items() if v is not None} | given)
    return filled, spec.runtime
