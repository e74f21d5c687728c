"""`mm-agent diagnose PATH...`: the root cause of a failed run; exit 1 when a failure was found.

`-` reads stdin; `--follow` keeps reading growing logs and returns as soon as a fatal cause appears.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mm_agent.diagnose import DiagnoseRequest, DiagnosisReport, Finding, diagnose_errors, follow
from mm_agent.errors import MMAgentError

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose",
        help="find the root cause in training logs (files, directories, .gz, - for stdin)",
        epilog="examples: mm-agent diagnose logs/   |   mm-agent diagnose logs/ --follow --timeout 3600   |   "
        "mm-agent diagnose --run train-20261123-153938-6ee6ec",
    )
    p.add_argument("paths", nargs="*", help="log files and/or directories (walked recursively); - = stdin")
    p.add_argument("--run", metavar="RUN", help="the log of a run mm-agent started (see mm-agent jobs)")
    p.add_argument(
        "--follow", action="store_true", help="keep reading growing logs; stop at the first fatal cause"
    )
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="with --follow: give up after SECONDS")
    p.add_argument("--max-evidence", type=int, default=5, metavar="N", help="evidence lines per finding")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    req = DiagnoseRequest(paths=args.paths, run_id=args.run, max_evidence=max(1, min(args.max_evidence, 100)))
    if args.follow and args.run:
        raise MMAgentError(
            "--follow reads paths", field="--run", fix="use `mm-agent logs RUN -f`, or pass the log path"
        )
    if args.timeout is not None and not args.follow:
        raise MMAgentError("--timeout only applies with --follow", field="--timeout", fix="add --follow")
    if args.follow:

        def ready(inputs: int) -> None:
            print(
                f"following {inputs} input(s) (Ctrl-C prints the summary so far) ...",
                file=sys.stderr,
                flush=True,
            )

        report = follow(req.paths, max_evidence=req.max_evidence, timeout=args.timeout, on_ready=ready)
    else:
        report = diagnose_errors(req)
    if args.json:
        print_json(report)
    else:
        _print(report)
    return 0 if report.category == "none" else 1


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> '0-2,4,6-7'."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _where(f: Finding) -> str:
    parts = [f.category, f.rule_id, f"x{f.count}"]
    if f.ranks:
        parts.append(f"rank {_ranks(f.ranks)}")
    if f.first_seen:
        parts.append(f"first {f.first_seen}")
    return "  ".join(parts)


def _print(report: DiagnosisReport) -> None:
    out = console()
    root = report.root_cause
    if root is None:
        out.print("no failure found (category none)", style="green", markup=False)
    else:
        out.print("ROOT CAUSE ", style="bold red", markup=False, end="")
        out.print(root.title, style="bold", markup=False)
        out.print(f"  {_where(root)}", markup=False)
        for ev in root.evidence:
            out.print(f"  {ev.file}:{ev.line}  ", style="dim", markup=False, end="")
            out.print(ev.text, markup=False)
        out.print(f"  cause: {root.cause}", markup=False)
        for i, fix in enumerate(root.fixes, 1):
            out.print(f"  {i}. [{fix.action}] {fix.text}", markup=False)
            if fix.command:
                out.print(f"       $ {fix.command}", markup=False)
        if root.env_vars:
            out.print(f"  env: {', '.join(root.env_vars)}", markup=False)
    others = report.findings[1:] if root else report.findings
    if others:
        out.print("other findings (symptoms and side notes, in time order):", style="bold", markup=False)
        for f in others:
            out.print(f"  - {f.title}  ({_where(f)})", markup=False)
            if f.evidence:
                ev = f.evidence[0]
                out.print(f"      {ev.file}:{ev.line}  {ev.text[:200]}", markup=False)
    p = report.progress
    if p.iteration is not None:
        bits = [f"iteration {p.iteration}/{p.total_iterations}"]
        if p.last_loss is not None:
            bits.append(f"loss {p.last_loss:.4g} ({p.loss_trend})")
        if p.step_time_ms is not None:
            bits.append(f"{p.step_time_ms / 1000:.2f} s/step")
        if p.nan_iterations:
            bits.append(f"{p.nan_iterations} nan iteration(s)")
        bits.append(f"{p.checkpoints_saved} checkpoint(s) saved")
        out.print("progress: " + ", ".join(bits), markup=False)
    for note in report.notes:
        out.print(f"note: {note}", style="dim", markup=False)
    for skipped in report.skipped:
        out.print(f"skipped: {skipped}", style="dim", markup=False)
    out.print(
        f"read {len(report.files)} file(s), {report.lines} line(s), {_size(report.bytes)}",
        style="dim",
        markup=False,
    )
