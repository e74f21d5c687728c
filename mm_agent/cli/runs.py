"""`mm-agent runs [RUN_ID]`: background runs (conversions) and their state, progress, report and log."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from mm_agent.convert import ConvertReport
from mm_agent.runs import LOG_TAIL_LINES, RunStatus, RunStatusRequest, list_runs, run_dir_for, run_status

from .convert import print_report
from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "runs",
        help="list background runs, or show one (state, progress, report, log tail)",
        epilog="examples: mm-agent runs; mm-agent runs convert-20261122-101500-a1b2c3 --lines 50",
    )
    p.add_argument("run_id", nargs="?", help="run id (from `mm-agent convert --yes` or this list)")
    p.add_argument("--lines", type=int, default=LOG_TAIL_LINES, help="log lines to show for one run")
    add_json_flag(p)
    p.set_defaults(func=run)


def _progress(status: RunStatus) -> str:
    p = status.progress
    count = f"{p.done}/{p.total}" if p.total else ""
    return f"{count} {p.message}".strip()


def _show(status: RunStatus) -> None:
    out = console()
    colour = {"running": "blue", "succeeded": "green", "failed": "red", "killed": "red"}[status.state]
    out.print(f"[bold]{status.run_id}[/bold] ({status.kind}): [{colour}]{status.state}[/]")
    out.print(
        f"  pid {status.pid}, started {status.started}, finished {status.finished or '-'}", markup=False
    )
    out.print(
        f"  progress: {_progress(status) or '-'} (updated {status.progress.updated or '-'})", markup=False
    )
    out.print(f"  log: {status.log}", markup=False)
    if status.stop_hint:
        out.print(f"  stop: {status.stop_hint}", markup=False)
    if status.state == "killed":
        out.print("  the worker is gone without a report (signal, out of memory, reboot)", markup=False)
    if status.report is not None and status.kind == "convert":
        try:
            print_report(ConvertReport.model_validate(status.report))
        except ValidationError:
            out.print(f"  report: {status.report.get('message', status.report)}", markup=False)
    if status.log_tail:
        out.print("log tail:")
        for line in status.log_tail:
            out.print(f"  | {line}", markup=False)


def run(args: argparse.Namespace) -> int:
    if args.run_id:
        run_dir_for(args.run_id)  # a bad or unknown id is a usage error with the fix, not a traceback
        status = run_status(RunStatusRequest(run_id=args.run_id, log_lines=max(0, min(args.lines, 500))))
        if args.json:
            print_json(status)
        else:
            _show(status)
        return 0
    listing = list_runs()
    if args.json:
        print_json(listing)
        return 0
    out = console()
    if not listing.runs:
        out.print(f"no runs in {listing.runs_dir}", markup=False)
        return 0
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"runs ({listing.runs_dir})")
    for col in ("run id", "kind", "state", "pid", "started", "progress"):
        table.add_column(col)
    for s in listing.runs:
        table.add_row(s.run_id, s.kind, s.state, str(s.pid), s.started, Text(_progress(s)))
    out.print(table)
    return 0
