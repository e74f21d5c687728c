"""`mm-agent stop RUN|PID`: stop a run (its whole process group and workers) or a process mm-agent started.

Dry run unless --yes. A run id stops that run's processes only; a PID stops that process and its children,
and only if mm-agent started it.
"""

from __future__ import annotations

import argparse
from typing import Any

from mm_agent.jobs import StopJobResult, stop_job
from mm_agent.procs import StopRequest, StopResult, stop_process
from mm_agent.runs import run_dir_for

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "stop",
        help="stop a run or a process mm-agent started (dry run unless --yes)",
        description="Stop a run (by id: its process group and torchrun workers) or a process mm-agent "
        "started (by PID, with its children): SIGTERM, then SIGKILL after the timeout. Processes "
        "mm-agent did not start are never signalled.",
        epilog="examples: mm-agent jobs; mm-agent stop train-20261122-101500-a1b2c3 --yes; "
        "mm-agent ps; mm-agent stop 12345 --yes",
    )
    p.add_argument("target", metavar="RUN|PID", help="run id from `mm-agent jobs`, or PID from `mm-agent ps`")
    p.add_argument("--yes", action="store_true", help="really send the signals (default: dry run)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)"
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result: StopResult | StopJobResult
    if args.target.isdigit():
        result = stop_process(StopRequest(pid=int(args.target), confirm=args.yes, timeout_s=args.timeout))
        message = result.message
    else:
        run_dir_for(args.target)  # a bad or unknown id is a usage error with the fix
        result = stop_job(args.target, confirm=args.yes, timeout_s=args.timeout)
        message = "\n".join([result.message, *(f"  {c}" for c in result.commands)])
    if args.json:
        print_json(result)
    else:
        console().print(f"{result.status}: {message}", markup=False)
    return 0
