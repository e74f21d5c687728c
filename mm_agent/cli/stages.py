"""`mm-agent extract|train|sample|evaluate JOB_DIR`: run a stage of a rendered job (dry run unless --yes).

Like `mm-agent convert`: without `--yes` it checks the job and prints the command, environment and port
it would use; with `--yes` it starts the stage as a supervised background run and prints its id.
`--wait` follows it with a progress bar (iteration, loss, ETA; samples for extraction) and the exit code
says how it ended (0 succeeded, 1 otherwise). Ctrl-C while waiting stops the run it started.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.jobs import StageLaunch, StageRequest, start_stage, stop_job, wait_job
from mm_agent.jobs.schema import JobStatus, Stage

from .jobs import progress_text, show_status
from .output import add_json_flag, console, option_error, print_json

_HELP: dict[Stage, str] = {
    "extract": "extract video/text features for a rendered job (torchrun; dry run unless --yes)",
    "train": "train a rendered job (torchrun; dry run unless --yes)",
    "sample": "run a rendered job's inference on its trained checkpoint (dry run unless --yes)",
    "evaluate": "evaluate a rendered job's trained checkpoint on its evaluation set (dry run unless --yes)",
}


def add_parser(sub: Any) -> None:
    for stage, text in _HELP.items():
        p = sub.add_parser(
            stage,
            help=text,
            description=f"{text}. The stage runs in its own process group under a supervisor that logs, "
            "reports progress and stops it at the first fatal error in its log.",
            epilog=f"examples: mm-agent {stage} jobs/wan; mm-agent {stage} jobs/wan --yes --wait",
        )
        p.add_argument("job_dir", help="rendered job directory (with job.yaml)")
        if stage in ("extract", "train"):
            p.add_argument("--nproc", type=int, help="processes per node (default: the job's NPUS_PER_NODE)")
        p.add_argument(
            "--env",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="extra environment (device/communication variables only, e.g. MM_AGENT_DEVICE=cpu)",
        )
        p.add_argument(
            "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL on stop"
        )
        p.add_argument("--yes", action="store_true", help="start it (default: show what would run)")
        p.add_argument(
            "--wait", action="store_true", help="with --yes: follow it with a progress bar until it ends"
        )
        add_json_flag(p)
        p.set_defaults(func=run, stage=stage)


def _request(args: argparse.Namespace) -> StageRequest:
    env: dict[str, str] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise MMAgentError(
                f"--env {item!r} is not NAME=VALUE", field="--env", fix="write --env NAME=VALUE"
            )
        env[name] = value
    try:
        return StageRequest(
            job_dir=args.job_dir,
            stage=args.stage,
            confirm=args.yes,
            nproc_per_node=getattr(args, "nproc", None),
            env=env,
            stop_grace_s=args.grace,
        )
    except ValidationError as exc:
        raise option_error(exc, args.stage) from None


def print_launch(launch: StageLaunch) -> None:
    out = console()
    out.print(f"[bold]{launch.stage}[/bold] of {launch.job_dir} (runtime {launch.runtime})", highlight=False)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
    out.print(f"  command: {env} {shlex.join(launch.argv)}", markup=False)
    if launch.nproc_per_node:
        out.print(f"  processes per node: {launch.nproc_per_node}", markup=False)
    for path in launch.checked:
        out.print(f"  found: {path}", markup=False)
    out.print(launch.message, markup=False)


def _follow(run_id: str, stage: Stage, quiet: bool) -> JobStatus:
    """Progress bar until the run ends; Ctrl-C stops the run (and only it)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out = Console(stderr=True, highlight=False) if quiet else console()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=out, transient=True) as bar:
            task = bar.add_task(stage, total=None, info="starting")

            def update(s: JobStatus) -> None:
                done, total = s.progress.done, s.progress.total
                bar.update(task, completed=done, total=total or None, info=progress_text(s)[:80])

            return wait_job(run_id, on_update=update)
    except KeyboardInterrupt:
        stopped = stop_job(run_id, confirm=True)
        out.print(f"interrupted: {stopped.message}", markup=False)
        raise


def run(args: argparse.Namespace) -> int:
    launch = start_stage(_request(args))
    if launch.status == "dry_run" or not args.wait:
        if args.json:
            print_json(launch)
        else:
            print_launch(launch)
        return 0
    if not args.json:
        print_launch(launch)
    assert launch.run_id is not None
    try:
        final = _follow(launch.run_id, args.stage, quiet=args.json)
    except KeyboardInterrupt:
        return 130
    if args.json:
        print_json(final)
    else:
        show_status(final)
    return 0 if final.state == "succeeded" else 1
