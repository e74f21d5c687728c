"""`check_environment` (CLI `mm-agent doctor`): everything on this machine that will break a MindSpeed-MM run,
found before launch, each finding with its evidence and the fix. A job of the bundled runtime is checked for
what that runtime uses instead (`checks_bundled.py`; the MindSpeed-MM-only checks are skipped).

The checks live in `checks_*.py` (one module per group) and register themselves in `registry.CHECKS`
when imported; `CHECK_MODULES` below imports them in report order.
"""

from __future__ import annotations

import importlib
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path

from mm_agent.doctor.context import Context
from mm_agent.doctor.models import CheckResult, DoctorReport, DoctorRequest, MachineSummary
from mm_agent.doctor.probes import ProbeError
from mm_agent.doctor.registry import CHECKS, run_checks
from mm_agent.doctor.trainenv import NoTrainingEnv, agent_python
from mm_agent.errors import MMAgentError

__all__ = ["CHECKS", "CheckResult", "DoctorReport", "DoctorRequest", "check_environment"]

# Importing a check module registers its checks; this order is the report's order.
CHECK_MODULES = (
    "checks_python",
    "checks_bundled",
    "checks_ascend",
    "checks_mm",
    "checks_resources",
    "checks_ports",
    "checks_multinode",
    "checks_job",
)
for _name in CHECK_MODULES:
    importlib.import_module(f"mm_agent.doctor.{_name}")


def _machine(ctx: Context) -> MachineSummary:
    try:
        env = ctx.pyenv()
        python, executable = env.python, env.executable
    except NoTrainingEnv:
        python, executable = "-", "" if ctx.agent_fallback else ctx.python  # nothing judged
    except ProbeError:
        python, executable = "?", ctx.python
    try:
        smi = ctx.npu()
    except Exception:  # reported by npu_devices; the summary just leaves it out
        smi = None
    return MachineSummary(
        hostname=socket.gethostname(),
        platform=platform.platform(terse=True),
        arch=platform.machine(),
        cpus=os.cpu_count() or 1,
        python=python,
        python_executable=executable,
        python_source=ctx.python_source,
        agent_python=agent_python(),
        mm_version=ctx.version.id,
        model=f"{ctx.model.id} {ctx.size.id if ctx.size else ''}".strip() if ctx.model else None,
        mm_root=str(ctx.mm_root) if ctx.mm_root else None,
        job=str(ctx.job_dir) if ctx.job_dir else None,
        npus=len(smi.chips) if smi is not None and smi.error is None else None,
    )


def check_environment(
    req: DoctorRequest, root: Path | None = None, *, inspect: Callable[[Context], None] | None = None
) -> DoctorReport:
    """Run the registered checks (all, or `req.checks`) concurrently. With `root` (the MCP workspace) the
    job and every path it names, mm_root and python's folder must lie inside it; `python` must be a
    CPython executable (`interpreter.py`). Nothing a probe started is left running when this returns.
    `inspect` sees the run's context after the checks, while their cached probes are still at hand (the
    node fingerprint of `fingerprint.py` is built from them)."""
    start = time.monotonic()
    if req.checks:
        unknown = [c for c in req.checks if c not in CHECKS]
        if unknown:
            raise MMAgentError(
                f"unknown check id(s): {', '.join(unknown)}",
                field="checks",
                fix=f"use some of: {', '.join(CHECKS)}",
            )
    selected = [CHECKS[c] for c in CHECKS if not req.checks or c in req.checks]
    ctx = Context.build(req, root)
    try:
        results = run_checks(ctx, selected)
        machine = _machine(ctx)
        if inspect is not None:
            inspect(ctx)
    finally:
        ctx.scope.close()  # a probe still running past the deadline dies now, with all it started
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "warn", "fail", "skip")}
    return DoctorReport(
        ok=counts["fail"] == 0,
        counts=counts,
        machine=machine,
        checks=results,
        duration_ms=round((time.monotonic() - start) * 1000),
    )
