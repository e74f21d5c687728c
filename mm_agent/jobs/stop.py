"""`stop_job`: stop one run, and only what that run started.

For a job stage the targets are its process group (checked against the recorded leader start time) and
the recorded processes that left the group (torchrun's workers), each verified by PID *and* start time,
plus what the verified supervisor still has below it. `stop.json` is written first, so the supervisor
reports the run as "stopped" rather than failed. When the supervisor itself is gone, the report is
written here. A conversion run is stopped through `procs.stop_process` (its worker and children).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shlex
import time
from pathlib import Path

import psutil
from pydantic import ValidationError

from mm_agent import procs
from mm_agent.errors import MMAgentError
from mm_agent.jobs.schema import (
    STAGE_FILE,
    STAGES,
    STOP_FILE,
    JobProgress,
    JobReport,
    StageRecord,
    StopJobRequest,
    StopJobResult,
    StopTarget,
)
from mm_agent.jobs.status import job_status, stage_processes
from mm_agent.procs import StopRequest, StopResult, stop_process
from mm_agent.runs import PROGRESS, REPORT, RunMeta, read_json, read_meta, run_dir_for, utc_now, worker_alive
from mm_agent.runs import write_json_atomic as write_atomic

REPORT_WAIT_S = 10.0


def _supervisor(meta: RunMeta, run_dir: Path) -> psutil.Process | None:
    """The run's supervisor when it is still the recorded process (start time and run dir argument)."""
    if not worker_alive(meta):
        return None
    try:
        proc = psutil.Process(meta.pid)
        return proc if proc.cmdline()[-1:] == [str(run_dir)] else None
    except psutil.Error:
        return None


def _command(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid}: {shlex.join(proc.cmdline())}"
    except psutil.Error:
        return f"{proc.pid}: <gone>"


def _stop_worker(req: StopJobRequest, meta: RunMeta) -> StopJobResult:
    if not worker_alive(meta):
        return StopJobResult(
            run_id=req.run_id, status="not_running", message=f"run {req.run_id} is not running"
        )
    result = stop_process(StopRequest(pid=meta.pid, confirm=req.confirm, timeout_s=req.timeout_s))
    return StopJobResult(
        run_id=req.run_id,
        status=result.status,
        targets=result.targets,
        commands=[shlex.join(result.cmdline)] if result.cmdline else [],
        killed=result.killed,
        message=result.message,
    )


def stop_job(
    run_id: str, confirm: bool = False, timeout_s: float = 10.0, root: Path | None = None
) -> StopJobResult:
    """Dry run unless `confirm`: SIGTERM the run's processes, SIGKILL what is left after `timeout_s`; with
    `root` (a server's workspace), only its own runs."""
    try:
        req = StopJobRequest(run_id=run_id, confirm=confirm, timeout_s=timeout_s)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise MMAgentError(
            err["msg"], field=".".join(map(str, err["loc"])), fix="see `mm-agent stop --help`"
        ) from None
    run_dir = run_dir_for(req.run_id, root)
    meta = read_meta(run_dir)
    result = _stop_worker(req, meta) if meta.kind not in STAGES else _stop_stage(req, meta, run_dir)
    if result.status != "dry_run":
        result.state = job_status(req.run_id, log_lines=0).state
    return result


def stop(req: StopTarget, root: Path | None = None) -> StopJobResult | StopResult:
    """A run's processes (`stop_job`; with `root`, a run of that workspace) or one process mm-agent started
    (`procs.stop_process`)."""
    if req.run_id is not None:
        return stop_job(req.run_id, req.confirm, req.timeout_s, root)
    assert req.pid is not None  # (the model requires one of the two)
    return stop_process(StopRequest(pid=req.pid, confirm=req.confirm, timeout_s=req.timeout_s))


def _stop_stage(req: StopJobRequest, meta: RunMeta, run_dir: Path) -> StopJobResult:
    supervisor = _supervisor(meta, run_dir)
    raw = read_json(run_dir / STAGE_FILE)
    record = StageRecord.model_validate(raw) if raw is not None else None
    members = stage_processes(record) if record is not None else []
    below = []
    if supervisor is not None:
        with contextlib.suppress(psutil.Error):
            below = supervisor.children(recursive=True)
    targets = {p.pid: p for p in [*members, *below]}
    finished = read_json(run_dir / REPORT) is not None
    if not targets and (supervisor is None or finished):
        return StopJobResult(
            run_id=req.run_id, status="not_running", message=f"run {req.run_id} is not running"
        )
    commands = [_command(targets[pid]) for pid in sorted(targets)]
    if not req.confirm:
        return StopJobResult(
            run_id=req.run_id,
            status="dry_run",
            targets=sorted(targets),
            commands=commands,
            message=f"would send SIGTERM to run {req.run_id}'s {len(targets)} process(es) (its process group "
            f"{record.pgid if record else '-'} and its workers), then SIGKILL after {req.timeout_s:g} s to any "
            "still running; pass confirm=true (CLI: --yes)",
        )
    write_atomic(run_dir / STOP_FILE, {"requested": utc_now()})
    killed: list[int] = []
    if record is not None:
        killed = procs.stop_group(
            record.pgid, record.leader.create_time, targets.values(), req.timeout_s
        ).killed
    if supervisor is not None:
        end = time.monotonic() + REPORT_WAIT_S
        while read_json(run_dir / REPORT) is None and worker_alive(meta) and time.monotonic() < end:
            time.sleep(0.1)
    if read_json(run_dir / REPORT) is None and not worker_alive(meta):
        progress = JobProgress.model_validate(read_json(run_dir / PROGRESS) or {})
        write_atomic(
            run_dir / REPORT,
            JobReport(
                status="stopped",
                exit_code=None,
                stopped_by="user",
                message="stopped on request (mm-agent stop); the supervisor was already gone",
                progress=progress,
                finished=utc_now(),
                duration_s=round(time.time() - dt.datetime.fromisoformat(meta.started).timestamp(), 2),
            ),
        )
    extra_note = f"; SIGKILL needed for {killed}" if killed else ""
    return StopJobResult(
        run_id=req.run_id,
        status="stopped",
        targets=sorted(targets),
        commands=commands,
        killed=killed,
        message=f"stopped run {req.run_id}: {len(targets)} process(es) signalled{extra_note}",
    )
