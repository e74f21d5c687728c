"""`mm-agent jobs [RUN]` (alias `runs`): every run, job stages and conversions alike, or one in detail.

`show_status` is the one human rendering of a `JobStatus`, shared with `mm-agent status` and the
stage commands' `--wait`.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from mm_agent.convert import ConvertReport
from mm_agent.jobs import JobStatus, job_status, list_jobs
from mm_agent.runs import LOG_TAIL_LINES, run_dir_for

from .convert import print_report
from .output import add_json_flag, console, print_json

COLOURS = {"running": "blue", "succeeded": "green", "failed": "red", "stopped": "yellow", "killed": "red"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "jobs",
        aliases=["runs"],
        help="list runs (extraction, training, sampling, conversions), or show one",
        epilog="examples: mm-agent jobs; mm-agent jobs train-20261122-101500-a1b2c3 --lines 50",
    )
    p.add_argument("run_id", nargs="?", help="run id: show this run in detail (same as `mm-agent status`)")
    p.add_argument("--lines", type=int, default=LOG_TAIL_LINES, help="log lines to show for one run")
    add_json_flag(p)
    p.set_defaults(func=run)


def progress_text(s: JobStatus) -> str:
    """One line: iteration/loss/ETA for training, samples for extraction, done/total otherwise."""
    if s.iteration is not None:
        parts = [f"iter {s.iteration}/{s.total}"]
        if s.last_loss is not None:
            parts.append(f"loss {s.last_loss:.4g}")
        if s.step_time_ms is not None:
            parts.append(f"{s.step_time_ms:.0f} ms/it")
        if s.state == "running" and s.eta_s is not None:
            parts.append(f"ETA {s.eta_s:.0f} s")
        return ", ".join(parts)
    if s.extract_total is not None:
        eta = f", ETA {s.eta_s:.0f} s" if s.state == "running" and s.eta_s is not None else ""
        return f"{s.extract_done or 0}/{s.extract_total} samples{eta}"
    p = s.progress
    count = f"{p.done}/{p.total}" if p.total else ""
    return f"{count} {p.message}".strip()


def show_status(s: JobStatus) -> None:
    out = console()
    what = f"{s.kind} of {s.job_dir}" if s.job_dir else s.kind
    out.print(f"[bold]{s.run_id}[/bold] ({what}): [{COLOURS[s.state]}]{s.state}[/]")
    out.print(f"  started {s.started}, finished {s.finished or '-'}", markup=False)
    if s.pids or s.pgid:
        port = f", MASTER_PORT {s.master_port}" if s.master_port else ""
        out.print(
            f"  supervisor {s.supervisor_pid}, process group {s.pgid}{port}, live PIDs {s.pids}", markup=False
        )
    out.print(f"  progress: {progress_text(s) or '-'}", markup=False)
    if s.message:
        out.print(f"  {s.message}", markup=False)
    if s.root_cause is not None:
        rc = s.root_cause
        out.print(f"  root cause ({rc.category}, {rc.rule_id}): {rc.title}", markup=False)
        for line in rc.evidence:
            out.print(f"    > {line}", markup=False)
        for fix in rc.fixes:
            cmd = f"  $ {fix.command}" if fix.command else ""
            out.print(f"    fix ({fix.action}): {fix.text}{cmd}", markup=False)
    if s.state == "killed":
        out.print("  the supervisor is gone without a report (signal, out of memory, reboot)", markup=False)
    if s.kind == "convert" and s.report is not None:
        try:
            print_report(ConvertReport.model_validate(s.report))
        except ValidationError:
            out.print(f"  report: {s.report.get('message', s.report)}", markup=False)
    out.print(f"  log: {s.log}", markup=False)
    if s.stop_hint:
        out.print(f"  stop: {s.stop_hint}", markup=False)
    if s.log_tail:
        out.print("log tail:")
        for line in s.log_tail:
            out.print(f"  | {line}", markup=False)


def show_one(run_id: str, lines: int, as_json: bool) -> int:
    run_dir_for(run_id)  # a bad or unknown id is a usage error with the fix, not a traceback
    status = job_status(run_id, log_lines=lines)
    if as_json:
        print_json(status)
    else:
        show_status(status)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.run_id:
        return show_one(args.run_id, args.lines, args.json)
    listing = list_jobs()
    if args.json:
        print_json(listing)
        return 0
    out = console()
    if not listing.jobs:
        out.print(f"no runs in {listing.runs_dir}", markup=False)
        return 0
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    # A run id is what the user copies into the next command: never cut, wrapped or ellipsised. The
    # columns but progress never wrap; a terminal too narrow for them whole (and progress's longest word)
    # gets one block per run instead.
    rows = [(s.run_id, s.kind, s.state, s.started, progress_text(s)) for s in listing.jobs]
    heads = ("run id", "kind", "state", "started", "progress")
    widths = [max(cell_len(h), *(cell_len(r[i]) for r in rows)) for i, h in enumerate(heads[:4])]
    words = [cell_len(w) for r in rows for w in r[4].split()]
    widths.append(max(cell_len(heads[4]), *words, 1))
    if sum(widths) + 3 * len(widths) + 1 <= out.width:  # each column: a border and 1 space either side
        table = Table(title=f"runs ({listing.runs_dir})", title_justify="left")
        for col in heads[:4]:
            table.add_column(col, no_wrap=True)
        table.add_column(heads[4], overflow="fold")
        for run_id, kind, state, started, progress in rows:
            table.add_row(run_id, kind, Text(state, style=COLOURS[state]), started, Text(progress))
        out.print(table)
        return 0
    out.print(f"runs ({listing.runs_dir})", markup=False)
    for s in listing.jobs:
        out.print(s.run_id, markup=False, overflow="ignore", crop=False)
        out.print(f"  {s.kind}, [{COLOURS[s.state]}]{s.state}[/], started {s.started}")
        if progress := progress_text(s):
            out.print(f"  {progress}", markup=False)
    return 0
