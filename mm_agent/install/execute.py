"""Run an `InstallPlan` step by step: skip what is already done, log everything, stop at the first failure.

Each command is started with `mm_agent.procs.spawn` (argv, never a shell) inside an "activated" environment
(`VIRTUAL_ENV` and its `bin/` first on PATH, so install scripts' `pip` targets it). A step whose checks
already pass is not run again, which is what makes re-running a plan safe. Manual steps are never run;
their checks are reported. Root-only steps that are not done yet stop the run before anything starts, with
the commands to run under sudo: mm-agent never calls sudo itself.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, Field

from mm_agent.diagnose import DiagnosisReport, diagnose_text
from mm_agent.errors import MMAgentError
from mm_agent.install.checks import Check, passes, show
from mm_agent.install.plan import InstallPlan
from mm_agent.install.steps import Command, PlanStep
from mm_agent.procs import spawn, state_dir

StepStatus = Literal["done", "already_done", "manual_done", "manual_pending", "failed", "not_run"]
TAIL_LINES = 40
CHECK_TIMEOUT_S = 120.0

# (index, total, step, event) with event "start" or the step's final status.
ProgressCallback = Callable[[int, int, PlanStep, str], None]


class StepRun(BaseModel):
    id: str
    status: StepStatus
    seconds: float | None = None
    exit_code: int | None = None
    command: str | None = Field(default=None, description="the command that failed (shell-quoted)")
    message: str = ""


class InstallRun(BaseModel):
    status: Literal["succeeded", "failed"]
    log_file: str
    steps: list[StepRun]
    failed_step: str | None = None
    exit_code: int | None = None
    log_tail: list[str] = Field(default_factory=list, description="last lines of the failed step's output")
    diagnosis: DiagnosisReport | None = Field(default=None, description="root cause found in that output")
    manual_pending: list[str] = Field(
        default_factory=list, description="manual steps whose checks do not pass"
    )


def step_environment(plan: InstallPlan) -> dict[str, str]:
    """The process environment of every command: the plan's env activated, no prompts."""
    env = dict(os.environ)
    env.update(
        VIRTUAL_ENV=plan.env_path,
        PATH=f"{plan.env_path}/bin{os.pathsep}{env.get('PATH', '')}",
        GIT_TERMINAL_PROMPT="0",
        DEBIAN_FRONTEND="noninteractive",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYTHONHOME", None)
    return env


def _run_check(check: Check, env: dict[str, str], cwd: Path) -> tuple[bool, str]:
    try:
        proc = spawn(
            check.argv,
            purpose="install_deps check",
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        return False, f"{check.argv[0]}: {exc.strerror or exc}"
    try:
        out, err = proc.communicate(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False, f"check timed out after {CHECK_TIMEOUT_S:g} s"
    text = out.decode("utf-8", "replace")
    return passes(check, proc.returncode, text), (text + err.decode("utf-8", "replace")).strip()


def checks_pass(step: PlanStep, env: dict[str, str], cwd: Path) -> bool:
    """True when the step has checks and all of them pass."""
    return bool(step.verify) and all(_run_check(c, env, cwd)[0] for c in step.verify)


def root_preflight(steps: list[PlanStep], env: dict[str, str], cwd: Path) -> None:
    """Refuse before running anything when root-only steps are needed and this is not root."""
    if os.geteuid() == 0:
        return
    needed = [s for s in steps if s.requires_root and not s.manual and not checks_pass(s, env, cwd)]
    if needed:
        commands = [shlex.join(["sudo", *c.argv]) for s in needed for c in s.commands]
        raise MMAgentError(
            f"step(s) {', '.join(s.id for s in needed)} install system packages and need root",
            field="steps",
            fix="run these yourself, then run the install again (finished steps are skipped): "
            + " && ".join(commands),
        )


def _log(fh: IO[bytes], text: str) -> None:
    fh.write(text.encode("utf-8"))
    fh.flush()


def _run_command(cmd: Command, fh: IO[bytes], env: dict[str, str], base: Path) -> int:
    cwd = Path(cmd.cwd) if cmd.cwd else base
    _log(fh, f"$ {'cd ' + shlex.quote(str(cwd)) + ' && ' if cmd.cwd else ''}{shlex.join(cmd.argv)}\n")
    try:
        proc = spawn(
            cmd.argv, purpose="install_deps step", cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT
        )
    except OSError as exc:
        _log(fh, f"mm-agent: cannot start {cmd.argv[0]}: {exc.strerror or exc}\n")
        return 127
    return proc.wait()


def _failed_output(log: Path, offset: int) -> str:
    with log.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def _run_step(step: PlanStep, fh: IO[bytes], env: dict[str, str], base: Path) -> StepRun:
    started = time.monotonic()
    if step.manual:
        ok = checks_pass(step, env, base)
        _log(fh, "manual step, not run:\n" + "".join(f"  {line}\n" for line in step.instructions))
        return StepRun(
            id=step.id,
            status="manual_done" if ok else "manual_pending",
            message="checks pass" if ok else "do it by hand: " + "; ".join(step.instructions[-3:]),
        )
    if checks_pass(step, env, base):
        _log(fh, "checks already pass: skipped\n")
        return StepRun(id=step.id, status="already_done", seconds=0.0, message="checks already pass")
    for cmd in step.commands:
        if cmd.unless_exists and Path(cmd.unless_exists).exists():
            _log(fh, f"skip {shlex.join(cmd.argv)}: {cmd.unless_exists} exists\n")
            continue
        code = _run_command(cmd, fh, env, base)
        if code != 0:
            return StepRun(
                id=step.id,
                status="failed",
                seconds=round(time.monotonic() - started, 2),
                exit_code=code,
                command=shlex.join(cmd.argv),
                message=f"command exited with {code}",
            )
    for check in step.verify:
        ok, output = _run_check(check, env, base)
        _log(fh, f"check $ {show(check)}: {'ok' if ok else 'FAILED'}\n{output}\n")
        if not ok:
            return StepRun(
                id=step.id,
                status="failed",
                seconds=round(time.monotonic() - started, 2),
                exit_code=1,
                command=shlex.join(check.argv),
                message="the step ran but its verification failed"
                + (f" (expected output starting with {check.expect!r})" if check.expect else ""),
            )
    return StepRun(id=step.id, status="done", seconds=round(time.monotonic() - started, 2))


def log_path(plan: InstallPlan) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return state_dir() / "logs" / f"install-{plan.model}-{plan.mm_version}-{stamp}-{os.getpid()}.log"


def execute_plan(
    plan: InstallPlan,
    selected: list[str] | None = None,
    *,
    base: Path,
    on_progress: ProgressCallback | None = None,
) -> InstallRun:
    """Run the plan's steps (or the `selected` ids) in plan order; `base` is the cwd of path-less commands."""
    steps = [s for s in plan.steps if selected is None or s.id in selected]
    env = step_environment(plan)
    root_preflight(steps, env, base)
    log = log_path(plan)
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    runs: list[StepRun] = []
    failed: StepRun | None = None
    tail: list[str] = []
    diagnosis: DiagnosisReport | None = None
    with log.open("ab") as fh:
        _log(fh, f"# mm-agent install {plan.model} on MindSpeed-MM {plan.mm_version} ({plan.arch})\n")
        for index, step in enumerate(steps, start=1):
            if failed is not None:
                runs.append(
                    StepRun(id=step.id, status="not_run", message=f"stopped after {failed.id} failed")
                )
                continue
            if on_progress:
                on_progress(index, len(steps), step, "start")
            _log(fh, f"\n==> [{index}/{len(steps)}] {step.id}: {step.title}\n    why: {step.why}\n")
            offset = fh.tell()
            result = _run_step(step, fh, env, base)
            runs.append(result)
            if on_progress:
                on_progress(index, len(steps), step, result.status)
            if result.status == "failed":
                failed = result
                output = _failed_output(log, offset)
                tail = output.splitlines()[-TAIL_LINES:]
                diagnosis = diagnose_text(output, name=f"{log.name} [{step.id}]")
    return InstallRun(
        status="failed" if failed else "succeeded",
        log_file=str(log),
        steps=runs,
        failed_step=failed.id if failed else None,
        exit_code=failed.exit_code if failed else None,
        log_tail=tail,
        diagnosis=diagnosis,
        manual_pending=[r.id for r in runs if r.status == "manual_pending"],
    )
