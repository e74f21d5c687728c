"""The check registry and the concurrent runner.

A check is one function `fn(ctx) -> Outcome` registered with `@check(id, title, runtimes)`; adding a check is
adding one function to one of the `checks_*.py` modules. `runtimes` names whose jobs need what the check looks
at: a job of the bundled runtime (job.yaml `runtime: bundled`) skips the MindSpeed-MM-only checks (CANN, the
driver, the checkout, Megatron, MindSpeed, the pins) as "not used by the bundled runtime", and any other run
skips the bundled runtime's own checks. The runner gives each check its own daemon thread (a
check stuck on a hung filesystem cannot block the exit), waits until the run's deadline, and turns a check
that raised into a `fail` naming the check, so doctor itself never crashes: a refusal (`MMAgentError`,
e.g. a job path outside the workspace) with its own fix, anything else as a bug in that check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mm_agent.doctor.context import Context
from mm_agent.doctor.models import CheckResult, Status
from mm_agent.errors import MMAgentError
from mm_agent.jobspec import Runtime
from mm_agent.names import shown


@dataclass(frozen=True)
class Outcome:
    status: Status
    summary: str
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None


def ok(summary: str, evidence: Iterable[str] = ()) -> Outcome:
    return Outcome("ok", summary, list(evidence))


def warn(summary: str, fix: str, evidence: Iterable[str] = ()) -> Outcome:
    return Outcome("warn", summary, list(evidence), fix)


def fail(summary: str, fix: str, evidence: Iterable[str] = ()) -> Outcome:
    return Outcome("fail", summary, list(evidence), fix)


def skip(summary: str, evidence: Iterable[str] = ()) -> Outcome:
    return Outcome("skip", summary, list(evidence))


CheckFn = Callable[[Context], Outcome]


BOTH: tuple[Runtime, ...] = ("mindspeed-mm", "bundled")
MM_ONLY: tuple[Runtime, ...] = ("mindspeed-mm",)
BUNDLED_ONLY: tuple[Runtime, ...] = ("bundled",)
# Why a check does not run for a job of the other runtime (the report's `skip` summary).
NOT_USED: dict[Runtime, str] = {
    "bundled": "not used by the bundled runtime",
    "mindspeed-mm": "used by the bundled runtime only (a job rendered with --runtime bundled)",
}


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    fn: CheckFn
    runtimes: tuple[Runtime, ...] = BOTH  # the runtimes whose jobs need what this check looks at


CHECKS: dict[str, Check] = {}


def check(check_id: str, title: str, runtimes: tuple[Runtime, ...] = BOTH) -> Callable[[CheckFn], CheckFn]:
    """Register `fn` under `check_id`; the report lists checks in registration order. A check whose
    `runtimes` do not include the run's (the job's `runtime`, else mindspeed-mm) is a `skip` saying so."""
    if not runtimes or set(runtimes) - set(BOTH):
        raise ValueError(f"doctor check {check_id!r}: runtimes must be some of {BOTH}")

    def register(fn: CheckFn) -> CheckFn:
        if check_id in CHECKS:
            raise ValueError(f"duplicate doctor check id {check_id!r}")
        CHECKS[check_id] = Check(check_id, title, fn, runtimes)
        return fn

    return register


def _run_one(chk: Check, ctx: Context, results: dict[str, CheckResult]) -> None:
    start = time.monotonic()
    try:
        out = chk.fn(ctx) if ctx.runtime in chk.runtimes else skip(NOT_USED[ctx.runtime])
    except MMAgentError as exc:  # a refusal (a path outside the workspace, a FIFO): the setup's, with its fix
        where = ": ".join(p for p in (exc.file, exc.field) if p)
        out = Outcome("fail", f"{where}: {exc.message}" if where else exc.message, [], exc.fix)
    except Exception as exc:
        out = Outcome(
            "fail",
            f"check {chk.id!r} crashed: {type(exc).__name__}: {exc}",
            [f"{type(exc).__name__}: {exc}"],
            f"this is a bug in mm-agent's {chk.id!r} check, not necessarily in your setup: report it, and "
            f"run the remaining checks with --check to see the rest",
        )
    judged = ctx.judged()  # which interpreter a check that read one judged, unless its evidence names it
    if judged is not None and not any(ctx.python in e for e in out.evidence):
        out = Outcome(out.status, out.summary, [*out.evidence, judged], out.fix)
    results[chk.id] = CheckResult(  # text from here on: a name that is not UTF-8 is shown escaped
        id=chk.id,
        title=chk.title,
        status=out.status,
        summary=shown(out.summary),
        evidence=[shown(e) for e in out.evidence],
        fix=shown(out.fix) if out.fix is not None else None,
        duration_ms=round((time.monotonic() - start) * 1000),
    )


def run_checks(ctx: Context, checks: list[Check]) -> list[CheckResult]:
    """Run `checks` concurrently; any still running at the deadline is reported as timed out."""
    results: dict[str, CheckResult] = {}
    threads = [
        threading.Thread(target=_run_one, args=(c, ctx, results), name=f"doctor-{c.id}", daemon=True)
        for c in checks
    ]
    start = time.monotonic()
    for t in threads:
        t.start()
    grace = 0.5  # probes stop at the deadline; leave them time to report
    for t in threads:
        t.join(max(0.0, ctx.deadline + grace - time.monotonic()))
    out = []
    for c in checks:
        res = results.get(c.id)
        if res is None:
            res = CheckResult(
                id=c.id,
                title=c.title,
                status="warn",
                summary=f"did not finish within {ctx.timeout_s:g} s",
                fix=(
                    f"run `mm-agent doctor --check {c.id} --timeout {ctx.timeout_s * 4:g}`; a check this slow "
                    "usually means a hung network filesystem or an overloaded machine"
                ),
                duration_ms=round((time.monotonic() - start) * 1000),
            )
        out.append(res)
    return out
