"""`mm-agent ps`: the processes mm-agent started that are still running (what `stop` can act on)."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from mm_agent.procs import ProcessList, list_processes, live_records, stale_training_processes

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ps",
        help="list processes mm-agent started (what `mm-agent stop` can act on)",
        epilog="example: mm-agent ps --all",
    )
    p.add_argument(
        "--all", action="store_true", help="also list other training processes (torchrun, pretrain_*.py, ...)"
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = list_processes()
    if args.all:
        seen = {p.pid for p in result.processes}
        others = [p for p in stale_training_processes(live_records()) if p.pid not in seen]
        result = ProcessList(state_dir=result.state_dir, processes=[*result.processes, *others])
    if args.json:
        print_json(result)
        return 0
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"processes (records in {result.state_dir})")
    for col in ("pid", "user", "up (s)", "mm-agent", "purpose", "command"):
        table.add_column(col)
    for p in result.processes:
        table.add_row(
            str(p.pid),
            p.user or "?",
            f"{p.age_s:.0f}" if p.age_s is not None else "?",
            "yes" if p.started_by_mm_agent else "no",
            Text(p.purpose or "-"),
            Text(shlex.join(p.cmdline)),
        )
    out = console()
    if result.processes:
        out.print(table)
    else:
        out.print("no running processes started by mm-agent", markup=False)
    return 0
