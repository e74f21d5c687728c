"""Follow a script's launch commands to the config files they pass, and load those files."""

from __future__ import annotations

import os
from pathlib import Path

from mm_agent.validate.files import ConfigFile
from mm_agent.validate.job import CONFIG_FLAGS, Job, Launch, exists, is_dir, is_file

_YAML_ENTRIES = ("pretrain_transformers.py", "trainer.py")
# The cross-file checks a config feeds: what is lost when the validator cannot tell where the file is.
CROSS_FILE_CHECKS = {
    "mm-model": "CP/TP vs attention heads, pipeline_num_layers vs PP and the converted checkpoint's stages, "
    "pipeline stages with zero LLM layers",
    "mm-data": "dataset keys vs attr, data folder and feature files, data format vs model",
    "mm-tool": "tool settings vs the model (profiling, sampling)",
    "yaml": "gpt_args flags (parallel sizes, batch sizes) vs the model and data sections",
    "fsdp2-config": "FSDP2 sharding vs world size and the model's modules",
    "load": "the checkpoint tracker, and its TP/PP/VPP stage layout (manifest) vs the job",
}


def build_launches(job: Job) -> None:
    done: set[Path] = set()
    while pending := [s for p, s in job.scripts.items() if p not in done]:
        for script in pending:
            done.add(script.path)
            for cmd in script.info.commands:
                launch = Launch(script=script, cmd=cmd, flags=dict(cmd.flags))
                job.launches.append(launch)
                _follow(job, launch)
            for raw, _ in script.info.delegates:
                _delegate(job, raw)


def _delegate(job: Job, raw: str | None) -> None:
    """`bash "$STOCK_SCRIPT"`: validate the delegated script too when it is here (and inside the root)."""
    path = job.resolve(raw) if raw else None
    if path is not None and job.inside(path) and is_file(path):
        job.load_script(path)


def _follow(job: Job, launch: Launch) -> None:
    for role, flag in CONFIG_FLAGS.items():
        if flag in launch.flags:
            _attach(job, launch, role, flag, launch.value(flag), var=f"MM_{role[3:].upper()}")
    if launch.entry in _YAML_ENTRIES:
        yaml_arg = next(
            (p for p in launch.cmd.positionals if p is None or p.endswith((".yaml", ".yml"))), None
        )
        if yaml_arg is not None or any(p is None for p in launch.cmd.positionals):
            _attach(job, launch, "yaml", "<config yaml>", yaml_arg, var=None)
        yaml_cfg = launch.configs.get("yaml")
        if yaml_cfg is not None and yaml_cfg.kind == "transformers_yaml":
            _merge_gpt_args(launch, yaml_cfg)
    if "--fsdp2-config-path" in launch.flags:
        _attach(
            job, launch, "fsdp2-config", "--fsdp2-config-path", launch.value("--fsdp2-config-path"), var=None
        )


def _merge_gpt_args(launch: Launch, cfg: ConfigFile) -> None:
    """Turn `gpt_args: {use_torch_fsdp2: true, load: x}` into `--use-torch-fsdp2`, `--load x`."""
    gpt_args = cfg.get("gpt_args")
    if not isinstance(gpt_args, dict):
        return
    for key, value in gpt_args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is False or value is None or flag in launch.flags:
            continue
        launch.flags[flag] = [] if value is True else [str(value)]
        launch.yaml_flags[flag] = str(key)


def _attach(job: Job, launch: Launch, role: str, flag: str, raw: str | None, var: str | None) -> None:
    file, field, line = launch.where(flag if flag.startswith("--") else None, var)
    if role == "yaml":
        field = "<config yaml>"
    if raw is None:
        job.sink.info(
            "path.unresolved",
            file,
            f"the {role} config path is not known statically; not checked",
            "set the path with plain assignments (VAR=..., ${VAR:-default}, $JOB_DIR idiom) so it can be "
            "checked",
            field=field,
            line=line,
        )
        return
    path, why = run_time_path(job, launch, raw)
    if path is None:
        checks = CROSS_FILE_CHECKS.get(role, "the checks that read it")
        skipped(job, f"{role} config", raw, why, checks, (file, field, line))
        return
    if job.outside(path, file, field, line):
        return
    if not is_file(path):
        _missing(job, role, raw, path, file, field, line)
        return
    cfg = job.load(path)
    if cfg is not None:
        launch.configs[role] = cfg
        if launch.cmd.cd_line is not None and cfg.run_base is None:
            cfg.run_base, _ = run_time_base(job, launch, ".")


def run_time_base(job: Job, launch: Launch, raw: str) -> tuple[Path | None, str]:
    """The directory a relative path in a launch starts from at run time: the one the script `cd`s into
    before the launch (for `cd "$MM_ROOT"`, the MindSpeed-MM root given to the validator when there is one),
    else, when the script does not cd (the job manager runs it from its own directory), the script's folder
    when the path exists there, else the MindSpeed-MM root. (None, "") for an absolute path; (None, why) when
    that directory cannot be known."""
    if os.path.isabs(os.path.expanduser(raw.strip())):
        return None, ""
    cmd, script = launch.cmd, launch.script
    if cmd.cd_line is not None:
        if cmd.cwd is None:
            return None, f"the script cd's (line {cmd.cd_line}) into a directory not known statically"
        if job.mm_root is not None and cmd.cwd == script.info.env.get("MM_ROOT"):
            return job.mm_root, ""
        base = Path(os.path.expanduser(cmd.cwd))
        return (base if base.is_absolute() else script.path.parent / base), ""
    here = job.resolve(raw, base=script.path.parent)
    if here is not None and exists(here):
        return script.path.parent, ""
    if job.mm_root is not None:
        return job.mm_root, ""
    return None, "the script does not cd, it is not next to the script, and the MindSpeed-MM root is unknown"


def run_time_path(job: Job, launch: Launch, raw: str) -> tuple[Path | None, str]:
    """Where a path in a launch points at run time (see `run_time_base`); (None, why) when unknown."""
    base, why = run_time_base(job, launch, raw)
    if base is None and why:
        return None, why
    return job.resolve(raw, base=base), ""


def skipped(
    job: Job, what: str, raw: str, why: str, checks: str, where: tuple[str, str | None, int | None]
) -> None:
    """The warning for a path whose run-time location cannot be known: which cross-file checks it costs."""
    file, field, line = where
    job.sink.warning(
        "crossfile.skipped",
        file,
        f"{what} {raw!r} is relative and {why}, so where it is at run time is not known; skipped: {checks}",
        "use an absolute or $JOB_DIR-based path, or cd into a known directory before the launch "
        '(cd "$MM_ROOT" with MM_ROOT set, or pass mm_root)',
        field=field,
        line=line,
    )


def _missing(
    job: Job, role: str, raw: str, path: Path, file: str, field: str | None, line: int | None
) -> None:
    """A config the command passes is not there. Under the MindSpeed-MM root it may be a stock config of a
    checkout that only exists on the cluster: not checked, unless that checkout is here (fsdp2 config)."""
    mm = job.mm_root
    in_checkout = mm is not None and path.is_relative_to(mm)
    if role == "fsdp2-config" and not (in_checkout and mm is not None and not is_dir(mm)):
        job.sink.error(
            "fsdp2.config_missing",
            file,
            f"--fsdp2-config-path {raw!r} does not exist ({path})",
            "point --fsdp2-config-path at the job's fsdp2_config.yaml (sharding_size, "
            "sub_modules_to_wrap, ...)",
            field=field,
            line=line,
        )
    elif in_checkout or not Path(raw.strip()).expanduser().is_absolute():
        job.sink.info(
            "path.unresolved",
            file,
            f"{role} config {raw!r} is not in the MindSpeed-MM checkout {mm} here; not checked",
            f"check {field} against the MindSpeed-MM checkout the job runs from",
            field=field,
            line=line,
        )
    else:
        job.sink.error(
            "config.missing",
            file,
            f"{role} config {raw!r} does not exist; MindSpeed-MM prints 'Warning: Config "
            "file not found' then 'RuntimeError: One or more config files failed to load'",
            f"fix {field} to point at the existing {role} file",
            field=field,
            line=line,
        )


def load_inputs(job: Job, files: list[Path]) -> None:
    for path in files:
        if path.suffix == ".sh":
            job.load_script(path)
        else:
            job.load(path, kind_hint="data_txt" if path.suffix == ".txt" else None)
