"""`mm-agent install MODEL`: show (and with --execute --yes run) the install plan of a model's stack.

A dry run by default: nothing is installed. `--execute` asks on a terminal and refuses elsewhere unless
`--yes` is given; `--script FILE` writes the same plan as a bash script to run by hand or under sudo.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.install.checks import show
from mm_agent.install.deps import InstallResult, install_deps
from mm_agent.install.plan import InstallPlan, InstallRequest
from mm_agent.install.schema import Arch, OsFamily
from mm_agent.install.steps import EnvKind, PlanStep

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "install",
        help="plan or run the install of a model's dependencies (dry run by default)",
        epilog="examples:\n  mm-agent install wan2.1 --mm-version 26.0.0 --arch aarch64\n"
        "  mm-agent install qwen3vl --also deepseekocr        # can they share one environment?\n"
        "  mm-agent install wan2.1 --script install.sh        # write the plan as a bash script\n"
        "  mm-agent install wan2.1 --execute --yes            # run it, step by step",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="registry model id or alias (see `mm-agent models`)")
    p.add_argument("--mm-version", help="MindSpeed-MM version (default: the registry default)")
    p.add_argument("--arch", choices=get_args(Arch), help="target CPU architecture (default: this machine's)")
    p.add_argument("--os-family", choices=get_args(OsFamily), help="distro family for system packages")
    p.add_argument(
        "--env", choices=get_args(EnvKind), default="venv", help="environment kind (default: venv)"
    )
    p.add_argument("--env-path", help="environment folder (default: envs/<model>-<version>)")
    p.add_argument("--mm-root", default="MindSpeed-MM", help="MindSpeed-MM checkout folder")
    p.add_argument("--src-dir", help="folder for Megatron-LM/decord checkouts (default: next to --mm-root)")
    p.add_argument("--python", help="Python version of the environment (default: the version matrix's)")
    p.add_argument(
        "--also",
        nargs="+",
        action="extend",
        default=[],
        metavar="MODEL",
        help="models meant to share the env",
    )
    p.add_argument(
        "--step", nargs="+", action="extend", dest="steps", metavar="ID", help="only these step ids"
    )
    p.add_argument("--script", metavar="FILE", help="write the plan as a bash script to FILE")
    p.add_argument("--execute", action="store_true", help="run the plan (asks first unless --yes)")
    p.add_argument("--yes", action="store_true", help="with --execute: do not ask")
    add_json_flag(p)
    p.set_defaults(func=run)


def _request(args: argparse.Namespace, confirm: bool) -> InstallRequest:
    fields = {
        "model": args.model,
        "mm_version": args.mm_version,
        "arch": args.arch,
        "os_family": args.os_family,
        "env": args.env,
        "env_path": args.env_path,
        "mm_root": args.mm_root,
        "src_dir": args.src_dir,
        "python": args.python,
        "also_models": args.also,
        "steps": args.steps,
        "confirm": confirm,
    }
    try:
        return InstallRequest(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise MMAgentError(err["msg"], field=where, fix="see `mm-agent install --help`") from None


def _confirmed(args: argparse.Namespace, plan: InstallPlan) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise MMAgentError(
            "refusing to install without confirmation: stdin is not a terminal",
            field="--execute",
            fix="review the plan (run without --execute), then pass --execute --yes",
        )
    chosen = [s for s in plan.steps if not args.steps or s.id in args.steps]
    answer = input(f"Run {len(chosen)} step(s) into {plan.env_path}? [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


def _stderr_console() -> Any:
    """Progress goes to stderr under --json so stdout is exactly the result model."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _print_step(out: Any, n: int, step: PlanStep) -> None:
    flags = [f for f, on in (("manual", step.manual), ("needs root", step.requires_root)) if on]
    out.print(
        f"[bold]{n:2d}. {step.id}[/bold]  {step.title}"
        + (f"  [yellow]({', '.join(flags)})[/]" if flags else "")
    )
    out.print(f"    why: {step.why}", markup=False)
    for cmd in step.commands:
        line = shlex.join(cmd.argv)
        line = f"(cd {shlex.quote(cmd.cwd)} && {line})" if cmd.cwd else line
        skip = f"   # skipped if {cmd.unless_exists} exists" if cmd.unless_exists else ""
        out.print(f"    $ {line}{skip}", markup=False)
    for line in step.instructions:
        out.print(f"    by hand: {line}", markup=False)
    for check in step.verify:
        out.print(f"    verify: {show(check)}", markup=False)
    for note in step.notes:
        out.print(f"    note: {note}", markup=False)


def _print_plan(plan: InstallPlan, steps: list[str] | None) -> None:
    out = console()
    also = f" (+ {', '.join(plan.also_models)} in the same env)" if plan.also_models else ""
    out.print(
        f"[bold]{plan.model}[/bold]{also} on MindSpeed-MM {plan.mm_version}, {plan.arch}/{plan.os_family}, "
        f"Python {plan.python} {plan.env} at {plan.env_path}"
    )
    for n, step in enumerate(plan.steps, start=1):
        if steps is None or step.id in steps:
            _print_step(out, n, step)
    if plan.conflicts:
        out.print("[bold red]conflicts[/bold red] (same environment):")
        for c in plan.conflicts:
            out.print(f"  - {c.kind} {c.package}: {c.explanation}", markup=False)
            out.print(f"    advice: {c.advice}", markup=False)
    for line in plan.upstream:
        out.print(f"README one-liner (the steps above do the same, pinned): {line}", markup=False)
    for note in plan.notes:
        out.print(f"note: {note}", markup=False)


def _print_run(result: InstallResult) -> None:
    run = result.run
    assert run is not None
    out = console()
    for step in run.steps:
        out.print(
            f"  {step.id}: {step.status}" + (f" ({step.message})" if step.message else ""), markup=False
        )
    if run.failed_step:
        out.print(f"[red]failed[/red] at {run.failed_step} (exit {run.exit_code}); log: {run.log_file}")
        for line in run.log_tail[-15:]:
            out.print(f"    | {line}", markup=False)
        cause = run.diagnosis.root_cause if run.diagnosis else None
        if cause is None:
            out.print(
                "diagnosis: no known failure signature in this output; read the lines above", markup=False
            )
        else:
            out.print(f"diagnosis: {cause.category}: {cause.title}", markup=False)
            for fix in cause.fixes[:3]:
                out.print(f"  fix: {fix.text}" + (f"  $ {fix.command}" if fix.command else ""), markup=False)
    else:
        out.print(f"[green]done[/green]; log: {run.log_file}")
    if run.manual_pending:
        out.print(f"still to do by hand: {', '.join(run.manual_pending)}", markup=False)


def run(args: argparse.Namespace) -> int:
    plan_only = install_deps(_request(args, confirm=False))
    plan = plan_only.plan
    if args.script:
        target = Path(args.script)
        target.write_text(plan.script, encoding="utf-8", newline="\n")
        target.chmod(0o755)
    if not args.execute:
        if args.json:
            print_json(plan_only)
            return 0
        _print_plan(plan, args.steps)
        if args.script:
            console().print(f"wrote {args.script}", markup=False)
        console().print("dry run: nothing was installed; run it with --execute --yes (or the script).")
        return 0
    if not args.json:
        _print_plan(plan, args.steps)
    if not _confirmed(args, plan):
        console().print("not confirmed: nothing was installed.")
        return 1
    err = _stderr_console() if args.json else console()

    def progress(index: int, total: int, step: PlanStep, event: str) -> None:
        text = f"running {step.title}" if event == "start" else event
        err.print(f"[{index}/{total}] {step.id}: {text}", markup=False)

    result = install_deps(_request(args, confirm=True), on_progress=progress)
    if args.json:
        print_json(result)
    else:
        _print_run(result)
    return 0 if result.status == "succeeded" else 1
