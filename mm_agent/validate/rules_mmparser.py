"""MindSpeed-MM's own verdict: with `mm_root` naming a MindSpeed-MM checkout, every torchrun (or plain
`python entry.py`) launch of the job is parsed by the parser that checkout builds and checked by its
`validate_args` (see `mmparser`), in one child process. Its rejections are errors on the flag they name;
launches it cannot judge are noted."""

from __future__ import annotations

import os
from pathlib import Path

from mm_agent.errors import MMAgentError
from mm_agent.validate.job import Job, Launch, to_int
from mm_agent.validate.mmparser import ParseJob, judge, locate
from mm_agent.validate.refs import run_time_path

TIMEOUT_S = 240.0
# Variables of the script that are not handed to the parser process (its own environment decides them).
_NOT_ENV = {"PATH", "HOME", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "PWD", "SHELL"}


def argv_of(launch: Launch) -> list[str] | None:
    """The entry script's argument list as the launch passes it (None when a word is not known statically)."""
    cmd = launch.cmd
    words: list[str | None] = list(cmd.positionals)
    for flag, values in cmd.flags.items():
        words.append(flag)
        words.extend(values)
    if any(w is None for w in words):
        return None
    return [w for w in words if w is not None]


def _world_size(launch: Launch) -> int | None:
    """torchrun's --nproc_per_node x --nnodes (1 each when absent); a plain `python x.py` is one process."""
    if launch.cmd.launcher == "python":
        return 1
    flags = launch.cmd.launcher_flags

    def first(*names: str) -> str | None:
        for name in names:
            if name in flags:
                return flags[name][0] if flags[name] else None
        return "1"

    nproc = to_int(first("--nproc_per_node", "--nproc-per-node"))
    nnodes_raw = first("--nnodes")
    nnodes = to_int(nnodes_raw.split(":")[-1]) if nnodes_raw else None
    return nproc * nnodes if nproc and nnodes else None


def check(job: Job, mm_root: Path) -> None:
    if not (mm_root / "mindspeed_mm" / "arguments.py").is_file():
        job.sink.info(
            "mmparser.not_checkout",
            str(mm_root),
            f"{mm_root} is not a MindSpeed-MM source checkout (no mindspeed_mm/arguments.py), so MindSpeed-MM's "
            "own argument parser did not judge the scripts",
            "pass the root of a MindSpeed-MM checkout (the folder holding pretrain_sora.py) as mm_root",
            field="mm_root",
        )
        return
    jobs: list[ParseJob] = []
    launches: dict[str, Launch] = {}
    for number, launch in enumerate(job.launches):
        if launch.cmd.launcher not in ("torchrun", "python") or launch.is_bundled or not launch.cmd.entry:
            continue
        file, _, line = launch.where()
        argv = argv_of(launch)
        world = _world_size(launch)
        if argv is None or world is None:
            job.sink.info(
                "mmparser.not_judged",
                file,
                "MindSpeed-MM's parser did not judge this launch: a flag value or the torchrun process count is "
                "not known statically",
                "set the values with plain assignments (VAR=..., ${VAR:-default}) so they can be judged",
                line=line,
            )
            continue
        env = {
            name: value
            for name, value in launch.script.info.env.items()
            if value is not None and name.isupper() and name not in _NOT_ENV
        }
        base, _ = run_time_path(job, launch, ".")
        jobs.append(
            ParseJob(
                id=str(number),
                entry=launch.cmd.entry,
                argv=argv,
                world_size=world,
                env=env,
                cwd=str(base) if base is not None and base.is_dir() else None,
            )
        )
        launches[str(number)] = launch
    if not jobs:
        return
    try:
        report = judge(locate(mm_root), jobs, timeout_s=TIMEOUT_S)
    except MMAgentError as exc:
        job.sink.warning(
            "mmparser.unavailable",
            str(mm_root),
            f"MindSpeed-MM's own parser could not be run: {exc.message}",
            exc.fix or "check the checkout and that torch is installed for mm-agent",
            field="mm_root",
        )
        return
    for verdict in report.verdicts:
        launch = launches[verdict.id]
        file, field, line = launch.where(verdict.flag)
        if not verdict.judged:
            job.sink.info(
                "mmparser.not_judged",
                file,
                f"{launch.cmd.entry} does not read MindSpeed-MM's arguments; its parser did not judge it",
                "nothing to do: the entry script checks its own arguments",
                line=line,
            )
        elif verdict.ok:
            job.sink.info(
                "mmparser.accepted",
                file,
                f"MindSpeed-MM ({os.path.basename(report.mm_root)}) accepts this launch: its parser "
                f"({report.parser_options} options) and {report.validator}",
                "nothing to do",
                line=line,
            )
        else:
            job.sink.error(
                "mmparser.rejected",
                file,
                f"MindSpeed-MM's own {verdict.stage} step rejects this launch of {launch.cmd.entry}: {verdict.error}",
                f"add {verdict.flag} or correct its value, then validate again with mm_root"
                if verdict.flag
                else "fix the launch as the message says, then validate again with mm_root",
                field=field if verdict.flag else None,
                line=line,
            )
