"""A rendered job as an estimate request: job.yaml for the model, size, task, layout and input shape, and the
rendered scripts and data configs for what the templates decided (LayerZero or FSDP2, recompute, LoRA, the
parallel sizes and the clip shape the data loader will produce). Request fields that are set win."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.estimate.profiles import Runtime
from mm_agent.estimate.schema import EstimateRequest, Sharding
from mm_agent.jobfile import JOB_FILE, load_job_spec
from mm_agent.jobspec import JobSpec
from mm_agent.paths import read_file
from mm_agent.registry import get_registry

MAX_CONFIG = 1024 * 1024
_MM_ROOT = re.compile(r"^MM_ROOT_DEFAULT=(.+)$", re.MULTILINE)  # templates/_common/header.sh.j2
_MM_MODEL = re.compile(r"^MM_MODEL=(.+)$", re.MULTILINE)
_ASSIGN = re.compile(r"^(TP|PP|CP|NPUS_PER_NODE)=(\d+)\s*$", re.MULTILINE)
_SHAPE_KEYS = {"num_frames": "frames", "max_height": "height", "max_width": "width"}
_ZERO_STAGE = re.compile(r"^\s*zero_stage:\s*(\d)\s*$", re.MULTILINE)  # accelerate's deepspeed_config
_DS_STAGE = re.compile(r'"stage"\s*:\s*(\d)')  # a DeepSpeed JSON's zero_optimization.stage
_BY_STAGE: dict[int, Sharding] = {1: "distributed-optimizer", 2: "zero2", 3: "zero3"}


class _Files:
    """The job's files as text: from `known` (texts the caller has already read, by path: validate_configs
    estimates the job whose files it has just loaded), else read here inside `root`."""

    def __init__(self, root: Path | None, known: Mapping[Path, str]) -> None:
        self.root = root
        self.known = known

    def text(self, path: Path) -> str:
        if (known := self.known.get(path)) is not None:
            return known
        return read_file(path, self.root, field="job_dir", limit=MAX_CONFIG).decode("utf-8", "replace")


def _scripts(job_dir: Path, files: _Files, spec: JobSpec) -> tuple[str, Path | None]:
    """The training launch script's text (the one with --train-iters), or '', and the job's MindSpeed-MM
    checkout. A job that wraps MindSpeed-MM's stock script (the `custom` template) holds no flags of its own:
    then the stock script in that checkout is read, when it is there and inside the roots."""
    mm_roots: list[Path] = []
    wrapper = ""
    for path in sorted(p for p in job_dir.glob("*.sh") if not p.name.startswith("inference")):
        text = files.text(path)
        with contextlib.suppress(ValueError, IndexError):  # an edited line that is no longer one word
            mm_roots += [Path(shlex.split(value)[0]) for value in _MM_ROOT.findall(text)]
        if "--train-iters" in text:
            return text, mm_roots[0] if mm_roots else None
        wrapper = wrapper or text
    mm_root = mm_roots[0] if mm_roots else None
    task = next((t for t in get_registry().get(spec.model).tasks if t.id == spec.task), None)
    if not wrapper or mm_root is None or task is None or not task.example_script:
        return "", mm_root
    try:
        return files.text(mm_root / task.example_script), mm_root
    except MMAgentError:
        return "", mm_root  # no checkout here (or outside the roots): the stock layout from the registry


def _model_config(script: str, job_dir: Path, mm_root: Path | None, files: _Files) -> dict[str, Any]:
    """The model config the training script passes (`MM_MODEL`), {} when it cannot be read here."""
    found = _MM_MODEL.search(script)
    if not found:
        return {}
    try:
        value = shlex.split(found.group(1))[0]  # "$MM_ROOT"/'examples/...json' -> $MM_ROOT/examples/...json
    except (ValueError, IndexError):
        return {}
    for name, base in (("$JOB_DIR", job_dir), ("$MM_ROOT", mm_root)):
        if value.startswith(name + "/") and base is not None:
            value = str(base) + value.removeprefix(name)
    path = Path(value)
    if not path.is_absolute():  # a stock script runs from its checkout
        if mm_root is None:
            return {}
        path = mm_root / path
    try:
        config = json.loads(files.text(path))
    except (MMAgentError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _model_layers(config: dict[str, Any]) -> int | None:
    """`predictor.num_layers`: the depth the job builds, which a stock example may cut (Wan2.1-14B DPO trains 8
    of the 40 layers)."""
    predictor = config.get("predictor", {})
    layers = predictor.get("num_layers") if isinstance(predictor, dict) else None
    return layers if isinstance(layers, int) and layers > 0 else None


# registry arch name -> the Qwen2.5-VL model.json key that sizes it
_VLM_ARCH = {
    "llm_layers": "text_decoder.num_layers", "llm_hidden": "text_decoder.hidden_size",
    "llm_ffn": "text_decoder.ffn_hidden_size", "llm_heads": "text_decoder.num_attention_heads",
    "num_query_groups": "text_decoder.num_query_groups", "vocab_size": "text_decoder.vocab_size",
    "vit_layers": "image_encoder.vision_encoder.num_layers", "vit_hidden": "image_encoder.vision_encoder.hidden_size",
    "vit_ffn": "image_encoder.vision_encoder.ffn_hidden_size",
    "vit_heads": "image_encoder.vision_encoder.num_attention_heads",
}  # fmt: skip


def _vlm_arch(config: dict[str, Any]) -> dict[str, int] | None:
    """The network a Qwen2.5-VL model config builds, in registry arch names (a bundled job sized from its
    weights is not the size's published network); None unless every dimension is there."""
    out: dict[str, int] = {}
    for name, dotted in _VLM_ARCH.items():
        node: Any = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, int) or isinstance(node, bool) or node <= 0:
            return None
        out[name] = node
    return out


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


def _data_shape(job_dir: Path, files: _Files) -> dict[str, int]:
    """num_frames / max_height / max_width of the training data config (feature_data.json, data.json)."""
    out: dict[str, int] = {}
    for name in ("feature_data.json", "data.json"):
        path = job_dir / name
        if path.is_file():
            try:
                _find_shape(json.loads(files.text(path)), out)
            except ValueError:
                continue  # validate_configs reports a broken config; the estimate keeps the stock shape
    return out


def _deepspeed_sharding(job_dir: Path, files: _Files) -> Sharding | None:
    """The ZeRO stage of an accelerate + DeepSpeed job (its DeepSpeed JSON wins over accelerate's config)."""
    for name, pattern in (("ds_config.json", _DS_STAGE), ("accelerate_config.yaml", _ZERO_STAGE)):
        path = job_dir / name
        if path.is_file():
            found = pattern.search(files.text(path))
            if found and int(found.group(1)) in _BY_STAGE:
                return _BY_STAGE[int(found.group(1))]
    return None


@dataclass(frozen=True)
class JobFacts:
    """What a job fixes beyond the request's fields: the runtime it renders for, its pipeline stages."""

    runtime: Runtime
    pp: int | None = None
    layers: int | None = None  # the model config's predictor.num_layers
    arch: dict[str, int] | None = None  # a VLM's dimensions as its model config builds them (vlm_arch)


def request_from_job(
    req: EstimateRequest, root: Path | None, known: Mapping[Path, str] | None = None
) -> tuple[EstimateRequest, JobFacts]:
    """The request with the job's values filled in, and the facts only the job knows. `known`: texts of the
    job's files the caller has already read (by resolved path), not read again."""
    job_dir = Path(req.job_dir or ".").expanduser()
    if root is not None and not job_dir.is_absolute():
        job_dir = root / job_dir
    if not (job_dir / JOB_FILE).is_file():
        raise MMAgentError(
            f"{job_dir} holds no {JOB_FILE}", field="job_dir", fix="pass a directory written by render_job"
        )
    spec = load_job_spec(job_dir / JOB_FILE, root)
    files = _Files(root, known or {})
    script, mm_root = _scripts(job_dir, files, spec)
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
    values["sharding"] = _deepspeed_sharding(job_dir, files) or values.get("sharding")
    for key, value in _data_shape(job_dir, files).items():
        values[key] = values[key] or value
    given = req.model_dump(exclude_none=True, exclude={"job_dir"})
    filled = EstimateRequest.model_validate({k: v for k, v in values.items() if v is not None} | given)
    config = _model_config(script, job_dir, mm_root, files)
    facts = JobFacts(
        runtime=spec.runtime,
        pp=spec.pp or assigned.get("PP"),
        layers=_model_layers(config),
        arch=_vlm_arch(config),
    )
    return filled, facts
