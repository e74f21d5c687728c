"""What a stage needs on disk before it is worth starting, each refusal with the command that fixes it.

A launch that dies after a minute of torchrun start-up, or worse, a MindSpeed-MM training that finds no
checkpoint under LOAD_PATH and silently trains from random weights, costs more than a stat() here:
extraction needs its dataset index, training needs the extracted features (feature datasets) and a
checkpoint in MindSpeed-MM layout under LOAD_PATH, sampling needs a trained checkpoint, and the runtime
itself must be there (the MindSpeed-MM checkout and torchrun, or the bundled runtime's interpreter).

Files are read through `paths.read_file`, which refuses a FIFO, socket or device before opening it (a FIFO
in place of a config would block the launch forever), and over MCP (`job.root`) every input named here
must lie in the workspace or an allowed root.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from mm_agent.errors import MMAgentError
from mm_agent.jobs.jobdir import StageScript
from mm_agent.jobs.resume import TRACKER
from mm_agent.jobspec import bundled_refusal
from mm_agent.paths import inside, read_file, require_regular, where
from mm_agent.registry import get_registry

MAX_CONFIG = 16 * 1024 * 1024  # a data config or dataset list; the datasets themselves are not read here


def _confined(job: StageScript, path: Path, what: str) -> Path:
    """`path`, when the launch is not confined or it lies in the workspace or an allowed root."""
    if job.root is not None and not inside(path, job.root):
        raise MMAgentError(
            f"{what} {path} lies outside {where(job.root)}",
            file=str(path),
            fix="re-render the job with its data inside the workspace (the server operator can allow "
            "another root with `mm-agent serve --allow-path DIR`)",
        )
    return path


def _text(job: StageScript, path: Path, what: str) -> str:
    if not path.exists():
        raise MMAgentError(
            f"{what} is missing", file=str(path), fix="re-render the job (mm-agent render --from job.yaml)"
        )
    data = read_file(_confined(job, path, what), job.root, field=what, limit=MAX_CONFIG)
    return data.decode("utf-8", errors="replace")


def _json(job: StageScript, path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(_text(job, path, what))
    except ValueError as exc:
        raise MMAgentError(
            f"{what} is not valid JSON: {exc}", file=str(path), fix="fix the file or re-render the job"
        ) from None
    if not isinstance(data, dict):
        raise MMAgentError(f"{what} is not a JSON object", file=str(path), fix="re-render the job")
    return data


def _dataset(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(dataset_type, data_path) of an MM data config."""
    param = config.get("dataset_param")
    if not isinstance(param, dict):
        return None, None
    basic = param.get("basic_parameters")
    path = basic.get("data_path") if isinstance(basic, dict) else None
    kind = param.get("dataset_type")
    return (kind if isinstance(kind, str) else None), (path if isinstance(path, str) else None)


def _convert_fix(job: StageScript, load_path: str) -> str:
    entry = get_registry().get(job.spec.model)
    weights = job.spec.weights_dir or "WEIGHTS_DIR"
    source = f"{weights}/transformer" if entry.family == "generative" else weights
    if entry.converter is None:
        return f"point load_path at the model weights and re-render, or put them at {load_path}"
    argv = ["mm-agent", "convert", entry.converter.class_name, entry.converter.to_training]
    argv += ["--source", source, "--target", load_path, "--yes"]
    return f"convert the weights first: {shlex.join(argv)} (then re-render if load_path changed)"


def _check_dataset_line(job: StageScript, index_path: Path, number: int, line: str) -> str:
    """One `folder,index` line of data.txt: both exist, inside the roots, the index a regular file."""
    folder, _, records = line.partition(",")
    for path, what in ((Path(folder.strip()), "dataset folder"), (Path(records.strip()), "dataset index")):
        if not path.exists():
            raise MMAgentError(
                f"{what} {path} (line {number} of {index_path.name}) does not exist",
                file=str(index_path),
                fix="put the videos and their data.json there, or re-render with --dataset-dir/--dataset-file",
            )
        _confined(job, path, what)
    require_regular(Path(records.strip()), "dataset_file")  # extraction reads it: never a FIFO or device
    return records.strip()


def _check_extract(job: StageScript) -> list[str]:
    data_json = job.job_dir / "feature_extract" / "data.json"
    _, index = _dataset(_json(job, data_json, "the feature-extraction data config"))
    if index is None:
        raise MMAgentError(
            "no dataset_param.basic_parameters.data_path",
            file=str(data_json),
            fix="re-render the job (mm-agent render --from job.yaml)",
        )
    index_path = job.path(index)
    checked = [str(index_path)]
    for number, line in enumerate(_text(job, index_path, "dataset list (data.txt)").splitlines(), 1):
        if line.strip():
            checked.append(_check_dataset_line(job, index_path, number, line))
    tools = job.job_dir / "tools.json"
    if job.root is not None and tools.exists():  # where the features are written
        feature = _json(job, tools, "the tools config").get("sorafeature")
        save = feature.get("save_path") if isinstance(feature, dict) else None
        if isinstance(save, str):
            _confined(job, job.path(save), "feature_dir")
    return checked


def _check_checkpoint(job: StageScript, *, trained: bool) -> list[str]:
    load = job.var("LOAD_PATH")
    if load is None:
        return []
    conv = get_registry().get(job.spec.model).converter
    # Megatron writes the tracker with every save and the mm converters write it too; dcp conversions
    # and models that load Hugging Face weights directly only need the directory.
    needs_tracker = trained or (conv is not None and conv.target_format == "mm")
    path = _confined(job, job.path(load), "LOAD_PATH")
    if (path / TRACKER).is_file() if needs_tracker else path.is_dir():
        return [str(path)]
    detail = f"{TRACKER} missing" if path.is_dir() else "directory missing"
    if trained:
        fix = f"train first: mm-agent train {shlex.quote(str(job.job_dir))} --yes"
        what = f"no trained checkpoint under LOAD_PATH ({detail})"
    else:
        fix = _convert_fix(job, str(path))
        kind = "converted checkpoint" if needs_tracker else "weights"
        what = f"no {kind} under LOAD_PATH ({detail}); training would start from random weights"
    raise MMAgentError(
        what,
        file=str(path),
        field="LOAD_PATH",
        fix=fix,
    )


def _check_features(job: StageScript) -> list[str]:
    data = job.var("MM_DATA")
    config_path = job.path(data) if data else job.job_dir / "feature_data.json"
    if not config_path.exists():
        return []
    kind, data_path = _dataset(_json(job, config_path, "the training data config"))
    if kind != "feature" or data_path is None:
        return [str(config_path)]
    features = _confined(job, job.path(data_path), "extracted features")
    if not features.is_file():
        raise MMAgentError(
            "extracted features are missing (the training dataset is the feature-extraction output)",
            file=str(features),
            fix=f"extract them first: mm-agent extract {shlex.quote(str(job.job_dir))} --yes",
        )
    return [str(config_path), str(features)]


def _bundled_can_run(job: StageScript) -> bool:
    """Whether render would accept `--runtime bundled` for this job's model, task and size."""
    entry = get_registry().get(job.spec.model)
    task = entry.task(job.spec.task, job.spec.backend)
    if task is None:
        return False
    allowed = [s for s in entry.sizes if task.sizes is None or s.id in task.sizes]
    size = entry.size(job.spec.size) if job.spec.size else next(iter(allowed), None)
    return size is not None and bundled_refusal(entry, task, size) is None


def _check_runtime(job: StageScript) -> list[str]:
    if job.runtime == "bundled":
        python = job.var("PYTHON")
        if python is not None and not os.access(python, os.X_OK):
            raise MMAgentError(
                f"the interpreter the job was rendered with ({python}) is not executable",
                file=str(job.script),
                field="PYTHON",
                fix="re-render the job from the environment that has mm-agent[runtime], or set PYTHON",
            )
        return [python] if python else []
    mm_root = job.var("MM_ROOT")
    if mm_root is not None and not Path(mm_root).is_dir():
        # only where render accepts it (jobspec.bundled_refusal: Wan-family t2v, Qwen2.5-VL)
        bundled = (
            "; for a run without MindSpeed-MM render with --runtime bundled" if _bundled_can_run(job) else ""
        )
        raise MMAgentError(
            "the MindSpeed-MM checkout the job runs in is missing",
            file=str(job.script),
            field="MM_ROOT",
            fix=f"install it (mm-agent install {job.spec.model} --execute --yes) or re-render with --mm-root"
            + bundled,
        )
    if shutil.which("torchrun") is None:
        raise MMAgentError(
            "torchrun is not on PATH, and the MindSpeed-MM scripts call it",
            field="PATH",
            fix="start mm-agent from the MindSpeed-MM environment (activate its venv/conda env first)",
        )
    return [mm_root] if mm_root else []


def check_inputs(job: StageScript) -> list[str]:
    """Everything the stage reads that must already exist; the paths checked, or a refusal with its fix."""
    checked = _check_runtime(job)
    if job.stage == "extract":
        checked += _check_extract(job)
    elif job.stage == "train":
        checked += _check_features(job) + _check_checkpoint(job, trained=False)
    else:
        checked += _check_checkpoint(job, trained=True)
    return checked
