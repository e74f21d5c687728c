"""`mm-agent stop PID`: stop a process mm-agent started (dry run unless --yes)."""

from __future__ import annotations

import argparse
from typing import Any

from mm_agent.procs import StopRequest, stop_process

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "stop",
        help="stop a process mm-agent started (dry run unless --yes)",
        description="Stop a process mm-agent started, with its children: SIGTERM, then SIGKILL after the "
        "timeout. Processes mm-agent did not start are never signalled.",
        epilog="example: mm-agent ps; mm-agent stop 12345; mm-agent stop 12345 --yes",
    )
    p.add_argument("pid", type=int, help="PID from `mm-agent ps` or a doctor stop hint")
    p.add_argument("--yes", action="store_true", help="really send the signals (default: dry run)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)"
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = stop_process(StopRequest(pid=args.pid, confirm=args.yes, timeout_s=args.timeout))
    if args.json:
        print_json(result)
    else:
        console().print(f"{result.status}: {result.message}", markup=False)
    return 0
