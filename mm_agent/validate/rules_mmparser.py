"""MindSpeed-MM's own verdict: with `mm_root` naming a MindSpeed-MM checkout, every torchrun (or plain
`python entry.py`) launch of the job is parsed by the parser that checkout builds and checked by its
`validate_args` (see `mmparser`), in one child process. Its rejections are errors on the flag they name;
launches it cannot judge are noted.

That child imports the checkout's own Python (mindspeed_mm, megatron, mindspeed): whatever a folder holds
there runs with the caller's rights. So it runs only when the caller may run it: the CLI (the operator named
the checkout), or an MCP server whose operator trusted a folder holding every tree it imports
(`mm-agent serve --trust-mm-root DIR`). Otherwise the answer is a dry run: what would run, and how to allow
it. When it runs, the answer says whose code ran (`ValidationReport.ran_code_from`)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from mm_agent.errors import MMAgentError
from mm_agent.validate.job import Job, Launch, to_int
from mm_agent.validate.mmparser import (
    ParseJob,
    ParserNotStarted,
    Trees,
    code_dirs,
    entry_kind,
    judge,
    locate,
)
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


def _trees_text(trees: Trees) -> str:
    """`<mm_root>` plus the Megatron and MindSpeed trees found next to it, as the child would import them."""
    extra = [
        f"{name} from {path}"
        for name, path in (("megatron", trees.megatron), ("mindspeed", trees.mindspeed))
        if path
    ]
    return str(trees.mm_root) + (f" ({', '.join(extra)})" if extra else "")


def _untrusted(trees: Trees, trust: Sequence[Path] | None) -> list[Path]:
    """The trees the child would import that no trusted folder holds (none when the caller is the operator)."""
    if trust is None:
        return []
    held = [t.resolve() for t in trust]
    return [d for d in code_dirs(trees) if not any(d.resolve().is_relative_to(t) for t in held)]


def _not_run(job: Job, trees: Trees, count: int, untrusted: list[Path], paths: Sequence[str]) -> None:
    """The dry-run answer: what would run, and the two ways to allow it."""
    named = " ".join(shlex.quote(p) for p in paths)
    job.sink.info(
        "mmparser.not_run",
        str(trees.mm_root),
        f"MindSpeed-MM's own parser was not run: judging {count} launch(es) would run Python code from "
        f"{_trees_text(trees)} in a child process, with this server's rights, and this server's operator "
        f"trusts no folder holding {', '.join(str(p) for p in untrusted)}",
        "to allow it for a checkout you trust, restart the server with `mm-agent serve "
        + " ".join(f"--trust-mm-root {shlex.quote(str(p))}" for p in untrusted)
        + f"` (a folder holding them will do), or run `mm-agent validate {named} --mm-root "
        f"{shlex.quote(str(trees.mm_root))}` yourself",
        field="mm_root",
    )


def _ran(job: Job, trees: Trees, count: int) -> None:
    job.sink.info(
        "mmparser.code_ran",
        str(trees.mm_root),
        f"code from {trees.mm_root} was run: MindSpeed-MM's parser and validate_args, imported from "
        f"{_trees_text(trees)}, judged {count} launch(es) in a child process",
        "nothing to do; validate without mm_root to run no code from a checkout",
        field="mm_root",
    )


def check(job: Job, mm_root: Path, paths: Sequence[str], trust: Sequence[Path] | None = None) -> str | None:
    """Judge the job's launches with the checkout's parser when `trust` allows it (None: the operator's own
    call, which always may); `paths` are the request's, for the command that runs it by hand. Returns the
    checkout whose code ran, or None when none ran."""
    if not (mm_root / "mindspeed_mm" / "arguments.py").is_file():
        job.sink.info(
            "mmparser.not_checkout",
            str(mm_root),
            f"{mm_root} is not a MindSpeed-MM source checkout (no mindspeed_mm/arguments.py), so MindSpeed-MM's "
            "own argument parser did not judge the scripts",
            "pass the root of a MindSpeed-MM checkout (the folder holding pretrain_sora.py) as mm_root",
            field="mm_root",
        )
        return None
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
        return None
    trees = locate(mm_root)
    judged = sum(entry_kind(trees.mm_root, j.entry)[0] is not None for j in jobs)
    if not judged:
        report = judge(trees, jobs, timeout_s=TIMEOUT_S)  # nothing to parse: no child is started
    elif untrusted := _untrusted(trees, trust):
        _not_run(job, trees, judged, untrusted, paths)
        return None
    else:
        try:
            report = judge(trees, jobs, timeout_s=TIMEOUT_S)
        except MMAgentError as exc:
            if not isinstance(exc, ParserNotStarted):
                _ran(job, trees, judged)
            job.sink.warning(
                "mmparser.unavailable",
                str(mm_root),
                f"MindSpeed-MM's own parser could not be run: {exc.message}",
                exc.fix or "check the checkout and that torch is installed for mm-agent",
                field="mm_root",
            )
            return None if isinstance(exc, ParserNotStarted) else str(trees.mm_root)
        _ran(job, trees, judged)
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
    return str(trees.mm_root) if judged else None
