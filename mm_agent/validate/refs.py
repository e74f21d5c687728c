"""Follow a script's launch commands to the config files they pass, and load those files."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from mm_agent.validate.files import ConfigFile, is_hostfile
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
    found = locate(job, launch, raw)
    if found.path is None:
        if role == "fsdp2-config" and found.run.mm_here:
            job.sink.error(
                "fsdp2.config_missing",
                file,
                f"--fsdp2-config-path {raw!r} is in none of {found.tried}",
                "point --fsdp2-config-path at the job's fsdp2_config.yaml (sharding_size, "
                "sub_modules_to_wrap, ...)",
                field=field,
                line=line,
            )
            return
        checks = CROSS_FILE_CHECKS.get(role, "the checks that read it")
        skipped(job, f"{role} config", raw, found.why, checks, (file, field, line), fix=found.fix)
        return
    path = found.path
    if job.outside(path, file, field, line):
        return
    if not is_file(path):
        _missing(job, role, raw, path, file, field, line)
        return
    resolved_note(job, f"{role} config", raw, found, (file, field, line))
    cfg = job.load(path)
    if cfg is not None:
        launch.configs[role] = cfg
        if cfg.run_base is None and not cfg.search:  # the first launch that passes it decides
            cfg.run_base = found.run.known
            cfg.search = tuple(folder for folder, _ in found.run.candidates)


@dataclass
class RunDir:
    """Where the relative paths of one launch are read from at run time, as far as the script tells."""

    known: Path | None = None  # the directory it `cd`s into, when that directory is on this machine
    # else the folders that may hold its paths, in order, each with what it is
    candidates: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    unknown: str = ""  # why no directory can be named: a `cd` into a directory not known statically
    note: str = ""  # how the run decides: "the script does not cd", "... cd's into X, not on this machine"
    mm_here: bool = False  # the MindSpeed-MM root is among the candidates and on this machine


@dataclass
class Located:
    """A launch's relative path placed (`path`, in `base`), or why not (`why`, `fix`)."""

    run: RunDir
    path: Path | None = None
    base: Path | None = None
    why: str = ""
    fix: str | None = None
    tried: str = ""


def run_dir(job: Job, launch: Launch) -> RunDir:
    """Where a launch's relative paths are read from. A `cd` before the launch decides it when its directory is
    here (for `cd "$MM_ROOT"`: the root given to the validator, else the script's own MM_ROOT). Otherwise the
    directory the run starts in is not known here: the script does not cd (`mm-agent launch` and launch_all.sh
    start it in its job directory, the stock scripts are started in the MindSpeed-MM root), or it cd's into a
    directory that is not on this machine (a job copied off the cluster); then the job directory, the script's
    directory and the MindSpeed-MM root are tried, in that order."""
    cmd, script = launch.cmd, launch.script
    mm = job.mm_root_of(script)
    if cmd.cd_line is not None:
        into_mm = (
            cmd.cwd == script.info.env.get("MM_ROOT") if cmd.cwd is not None else cmd.cd_var == "MM_ROOT"
        )
        if mm is not None and into_mm:  # MM_ROOT from the environment: the root the validator was given
            target = mm
        elif cmd.cwd is None:
            return RunDir(
                unknown=f"the script cd's (line {cmd.cd_line}) into a directory not known statically"
            )
        else:
            target = Path(os.path.expanduser(cmd.cwd))
            target = Path(os.path.normpath(target if target.is_absolute() else script.path.parent / target))
        if not job.inside(target) or is_dir(target):
            return RunDir(known=target)
        note = f"the script cd's (line {cmd.cd_line}) into {target}, which is not on this machine"
    else:
        note = "the script does not cd"
    mm_here = mm is not None and job.inside(mm) and is_dir(mm)
    folders = [
        (job.job_dir(script.path), "the job directory"),
        (script.path.parent, "the script's directory"),
        *([(mm, "MM_ROOT" + ("" if mm_here else ", not here"))] if mm is not None else []),
    ]
    candidates: dict[Path, str] = {}
    for folder, what in folders:  # one folder in two roles: "the job directory and script's directory"
        known = candidates.get(folder)
        candidates[folder] = f"{known} and {what.removeprefix('the ')}" if known else what
    return RunDir(candidates=list(candidates.items()), note=note, mm_here=mm_here)


def locate(job: Job, launch: Launch, raw: str) -> Located:
    """Place a path a launch passes (`run_dir`): in the directory it runs in when that is known, else in the first
    candidate directory that holds it; when none does, say why and what to do."""
    run = run_dir(job, launch)
    text = os.path.expanduser(raw.strip())
    if os.path.isabs(text):
        return Located(run, Path(os.path.normpath(text)))
    if run.unknown:
        return Located(
            run,
            why=f"{run.unknown}, so where it is at run time is not known",
            fix="use an absolute or $JOB_DIR-based path, or cd into a known directory before the launch "
            '(cd "$MM_ROOT" with MM_ROOT set, or pass mm_root)',
        )
    if run.known is not None:
        return Located(run, Path(os.path.normpath(run.known / text)), run.known)
    for folder, _ in run.candidates:
        path = Path(os.path.normpath(folder / text))
        if job.inside(path) and exists(path):
            return Located(run, path, folder)
    tried = "; ".join(f"{folder} ({what})" for folder, what in run.candidates)
    mm = job.mm_root_of(launch.script)
    unknown = "" if mm is not None else "; the MindSpeed-MM root is unknown"
    return Located(
        run,
        why=f"{run.note}, and it is in none of {tried}{unknown}",
        fix=f"copy {raw.strip()!r} into the job directory (or make the path absolute or $JOB_DIR-based), or pass "
        f"--mm-root with a local checkout that holds it{f' (the run uses {mm})' if mm is not None else ''}",
        tried=tried,
    )


def resolved_note(
    job: Job, what: str, raw: str, found: Located, where: tuple[str, str | None, int | None]
) -> None:
    """Say which directory a launch's relative path was found in when the script does not decide it (not when
    a script that does not cd finds it in its own folder, the job directory: where it is started anyway)."""
    run = found.run
    if found.base is None or run.known is not None:
        return
    label = dict(run.candidates).get(found.base, "")
    if label == "the job directory and script's directory" and not run.note.startswith("the script cd's"):
        return
    file, field, line = where
    job.sink.info(
        "path.resolved",
        file,
        f"{what} {raw.strip()!r} checked as {found.path}, found in {label} {found.base} ({run.note})",
        "make the path absolute or $JOB_DIR-based if the run reads another file",
        field=field,
        line=line,
    )


def run_time_base(job: Job, launch: Launch, raw: str) -> tuple[Path | None, str]:
    """The directory a relative path in a launch resolves in (`locate`): (None, "") for an absolute path;
    (None, why) when it cannot be placed."""
    found = locate(job, launch, raw)
    return found.base, found.why


def run_time_path(job: Job, launch: Launch, raw: str) -> tuple[Path | None, str]:
    """Where a path in a launch points (`locate`); (None, why) when it cannot be placed."""
    found = locate(job, launch, raw)
    return found.path, found.why


def skipped(
    job: Job,
    what: str,
    raw: str,
    why: str,
    checks: str,
    where: tuple[str, str | None, int | None],
    *,
    fix: str | None = None,
) -> None:
    """The warning for a path that cannot be placed (`locate`): which cross-file checks it costs, and the fix."""
    file, field, line = where
    job.sink.warning(
        "crossfile.skipped",
        file,
        f"{what} {raw!r} is relative and {why}; skipped: {checks}",
        fix
        or "use an absolute or $JOB_DIR-based path, or cd into a known directory before the launch "
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
            job.load(
                path,
                kind_hint="hostfile" if is_hostfile(path) else "data_txt" if path.suffix == ".txt" else None,
            )
