"""`mm-agent doctor`: check this machine before launching; exit 1 when any check fails."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_agent.doctor import CHECKS, DoctorReport, DoctorRequest, check_environment
from mm_agent.errors import MMAgentError

from .output import add_json_flag, console, print_json

if TYPE_CHECKING:
    from mm_agent.doctor.hosts import HostsReport

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the machine for everything that would break a MindSpeed-MM run",
        description="Check Python, torch/torch_npu, CANN, NPUs, the MindSpeed-MM checkout, dependencies, "
        "ports, shared memory, disk and RAM. Safe to run first: it only reads.",
        epilog="checks: "
        + ", ".join(CHECKS)
        + "\nexample: mm-agent doctor --model wan2.1 --mm-root ~/MindSpeed-MM"
        + "\nmulti-node: on every node `mm-agent doctor --job DIR --fingerprint fp-$(hostname).json`, then on one"
        + "\n  `mm-agent doctor --hosts fp-*.json` compares them (versions, master reachability, NICs, pdsh)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", help="registry model id (enables its dependency, RAM and disk checks)")
    p.add_argument("--task", help="task id used with --model (t2v, sft, ...)")
    p.add_argument("--size", help="model size id (1.3b, 14b, ...)")
    p.add_argument("--mm-version", help="MindSpeed-MM version to check against (default: registry default)")
    p.add_argument("--mm-root", help="MindSpeed-MM checkout (default: job, $MM_ROOT, ./MindSpeed-MM)")
    p.add_argument("--job", help="rendered job directory: use its model, version, ports, workers and scripts")
    p.add_argument("--master-port", type=int, help="MASTER_PORT to check (default: job, $MASTER_PORT, 6000)")
    p.add_argument(
        "--python",
        help="interpreter of the training environment (default: the env of `torchrun` on PATH, an activated "
        "env, the checkout's .venv; mm-agent's own only when MindSpeed-MM is installed in it)",
    )
    p.add_argument(
        "--check", dest="checks", action="extend", nargs="+", metavar="ID", help="run only these checks"
    )
    p.add_argument("--timeout", type=float, default=2.5, help="seconds per probe (default 2.5)")
    p.add_argument(
        "--fingerprint",
        metavar="FILE",
        help="also write this node's fingerprint (versions, NICs, master reachability) as JSON to FILE",
    )
    p.add_argument(
        "--hosts",
        nargs="+",
        metavar="FILE",
        help="compare the fingerprints of a job's nodes instead of checking this machine",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show the evidence of every check")
    add_json_flag(p)
    p.set_defaults(func=run)


def render(report: DoctorReport, verbose: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    m = report.machine
    python = f", Python {m.python}" if m.python_executable else ""  # (of the training env judged, if any)
    title = f"mm-agent doctor: {m.hostname} ({m.arch}){python}, MindSpeed-MM {m.mm_version}"
    if m.model:
        title += f", {m.model}"
    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("result")
    for c in report.checks:
        table.add_row(Text(c.status.upper(), style=STYLE[c.status]), c.id, Text(c.summary))
        if verbose:
            for line in c.evidence:
                table.add_row("", "", Text(f"  {line}", style="dim"))
        if c.fix and c.status in {"fail", "warn"}:
            table.add_row("", "", Text(f"To fix: {c.fix}", style=STYLE[c.status].replace("bold ", "")))
    out = console()
    out.print(table)
    # which interpreter the environment checks judged, told apart from the one mm-agent runs in
    judged = f"{m.python_executable} ({m.python_source})" if m.python_executable else m.python_source
    out.print(Text(f"training env judged: {judged}; mm-agent runs in {m.agent_python}"))
    n = report.counts
    summary = f"{n['fail']} failed, {n['warn']} warning(s), {n['ok']} ok, {n['skip']} skipped in {report.duration_ms / 1000:.1f} s"
    if report.ok:
        out.print(Text.assemble(("READY", "bold green"), f": {summary}"))
    else:
        out.print(
            Text.assemble(("NOT READY", "bold red"), f": {summary}. Fix the failures above, then rerun.")
        )


def render_hosts(report: HostsReport, verbose: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    names = ", ".join(n.name + (" (node 0)" if n.master else "") for n in report.nodes)
    table = Table(title=f"mm-agent doctor --hosts: {names}", show_lines=False, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("nodes")
    table.add_column("result")
    for c in report.checks:
        table.add_row(
            Text(c.status.upper(), style=STYLE[c.status]), c.id, ", ".join(c.nodes), Text(c.summary)
        )
        if verbose or c.status in {"fail", "warn"}:
            for line in c.evidence:
                table.add_row("", "", "", Text(f"  {line}", style="dim"))
        if c.fix and c.status in {"fail", "warn"}:
            table.add_row("", "", "", Text(f"To fix: {c.fix}", style=STYLE[c.status].replace("bold ", "")))
    out = console()
    out.print(table)
    n = report.counts
    summary = f"{n['fail']} failed, {n['warn']} warning(s), {n['ok']} ok, {n['skip']} skipped"
    verdict = ("NODES AGREE", "bold green") if report.ok else ("NODES DIFFER", "bold red")
    out.print(Text.assemble(verdict, f": {summary}"))


def run(args: argparse.Namespace) -> int:
    if args.hosts:
        from mm_agent.doctor.hosts import compare_fingerprints

        if args.fingerprint:
            raise MMAgentError(
                "--hosts compares fingerprints and --fingerprint writes one: not both",
                field="--hosts",
                fix="write the fingerprint on each node first, then run `mm-agent doctor --hosts FILE ...` alone",
            )
        hosts = compare_fingerprints([Path(p) for p in args.hosts])
        if args.json:
            print_json(hosts)
        else:
            render_hosts(hosts, args.verbose)
        return 0 if hosts.ok else 1
    req = DoctorRequest(
        model=args.model,
        task=args.task,
        size=args.size,
        mm_version=args.mm_version,
        mm_root=args.mm_root,
        job=args.job,
        master_port=args.master_port,
        python=args.python,
        checks=args.checks,
        timeout_s=args.timeout,
    )
    if args.fingerprint:
        from mm_agent.doctor.fingerprint import doctor_with_fingerprint

        report, _ = doctor_with_fingerprint(req, Path(args.fingerprint))
    else:
        report = check_environment(req)
    if args.json:
        print_json(report)
    else:
        render(report, args.verbose)
    if args.fingerprint:
        print(f"fingerprint of this node written to {args.fingerprint}", file=sys.stderr)
    return 0 if report.ok else 1
