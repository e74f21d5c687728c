"""What the training will load (`load.*`): how many of the model's parameters its checkpoint fills.

For each training launch, `mm_agent.loadcheck` counts the names the job's model requests (its model config and
`registry/data/load_keys.yaml`) against the checkpoint it names, read without torch: a Megatron generative job's
`--load` (SoRAModel loads its predictor non-strictly), an FSDP2-native job's `training.load` (a non-strict DCP
load, compared with the Hugging Face checkpoint at `model.model_name_or_path`). Fewer than all is an error,
"N of M parameters would load; the rest start random". An FSDP2-native job that builds its model on the meta
device and loads nothing trains a random model (a warning: some stock examples do it on purpose); a StepVideo
predictor shallower than the released checkpoint is said (warning); a predictor whose `from_pretrained` is not one
checkpoint file (VACE's stock folder value) stops the job while it builds its model (error). Checkpoints that are not on this machine are not
counted.
"""

from __future__ import annotations

from pathlib import Path

from mm_agent.loadcheck import (
    Issue,
    depth_check,
    meta_init_check,
    native_check,
    predictor_check,
    pretrained_file_check,
)
from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import Job, Launch, is_dir
from mm_agent.validate.refs import locate


def check(job: Job) -> None:
    for launch in job.launches:
        if not launch.is_training or launch.is_bundled:
            continue
        model = launch.configs.get("mm-model")
        if model is not None and model.kind == "sora_model" and isinstance(model.data, dict):
            _megatron(job, launch, model)
        yaml_cfg = launch.configs.get("yaml")
        if yaml_cfg is not None and yaml_cfg.kind == "fsdp2_trainer_yaml" and isinstance(yaml_cfg.data, dict):
            _native(job, yaml_cfg)


def _report(job: Job, issue: Issue | None, file: str, line: int | None) -> None:
    if issue is None or issue.severity == "info":
        return
    say = job.sink.error if issue.severity == "error" else job.sink.warning
    say(issue.rule, file, issue.message, issue.fix, field=issue.field, line=line)


def _megatron(job: Job, launch: Launch, model: ConfigFile) -> None:
    assert isinstance(model.data, dict)
    _report(job, depth_check(model.data), str(model.path), model.line("predictor.num_layers"))
    _report(job, pretrained_file_check(model.data), str(model.path), model.line("predictor.from_pretrained"))
    raw = launch.value("--load")
    if not raw:
        return
    found = locate(job, launch, raw)
    if found.why or found.path is None or not job.inside(found.path) or not is_dir(found.path):
        return
    file, _, line = launch.where("--load")
    _report(job, predictor_check(model.data, found.path), file, line)


def _native(job: Job, cfg: ConfigFile) -> None:
    data = cfg.data
    assert isinstance(data, dict)
    _report(job, meta_init_check(data), str(cfg.path), cfg.line("training.init_model_with_meta_device"))
    training, model = data.get("training"), data.get("model")
    load = training.get("load") if isinstance(training, dict) else None
    hf = model.get("model_name_or_path") if isinstance(model, dict) else None
    if not isinstance(load, str) or not load:
        return
    load_dir = _here(job, cfg, load)
    hf_dir = _here(job, cfg, hf) if isinstance(hf, str) and hf else None
    if load_dir is None:
        return
    _report(
        job, native_check(data, load_dir, hf_dir, _version(job)), str(cfg.path), cfg.line("training.load")
    )


def _version(job: Job) -> str | None:
    """The MindSpeed-MM version the job was rendered for (its job.yaml; the registry default when it names none),
    None for a job mm-agent did not render."""
    for cfg in job.of_kind("job_yaml"):
        if isinstance(cfg.data, dict):
            value = cfg.data.get("mm_version")
            if isinstance(value, str):
                return value
            from mm_agent.registry import get_registry

            return get_registry().versions.default
    return None


def _here(job: Job, cfg: ConfigFile, raw: str) -> Path | None:
    """A folder a config names, where its launch reads it, when it is on this machine (inside the workspace)."""
    path, _, _ = job.locate(raw, base=cfg.run_base, search=cfg.search)
    if path is None or not job.inside(path) or not is_dir(path):
        return None
    return path
