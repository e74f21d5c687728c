"""`mm-agent validate PATH...`: check a job before launch; exit 1 when any error is found."""

from __future__ import annotations

import argparse
from typing import Any

from mm_agent.validate import ValidateRequest, validate_configs

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="validate a job directory or config files",
        epilog="example: mm-agent validate jobs/wan21 --strict",
    )
    p.add_argument("paths", nargs="+", help="job directories and/or config files")
    p.add_argument(
        "--strict", action="store_true", help="treat warnings as errors (use on the training machine)"
    )
    p.add_argument(
        "--mm-root",
        help="MindSpeed-MM checkout: relative config paths start from it, and its own argument parser and "
        "validate_args judge every torchrun launch of the job (child process; MindSpeed and Megatron-LM "
        "next to it, or Megatron copied into it; needs torch)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    report = validate_configs(ValidateRequest(paths=args.paths, strict=args.strict, mm_root=args.mm_root))
    if args.json:
        print_json(report)
        return 0 if report.ok else 1
    out = console()
    colour = {"error": "red", "warning": "yellow", "info": "blue"}
    for f in report.findings:
        where = f.file + (f":{f.line}" if f.line else "") + (f" [{f.field}]" if f.field else "")
        # (the file and field are text: `[server_count]` must not be read as a rich style tag)
        out.print(f"[{colour[f.severity]}]{f.severity}[/] {escape(f.rule)} {escape(where)}", markup=True)
        out.print(f"    {f.message}", markup=False)
        out.print(f"    fix: {f.fix}", markup=False)
    verdict = "[green]OK[/green]" if report.ok else "[red]FAILED[/red]"
    out.print(
        f"{verdict}: {report.error_count} error(s), {report.warning_count} warning(s) in {len(report.files)} file(s)"
    )
    return 0 if report.ok else 1
