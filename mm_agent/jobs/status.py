"""`job_status`, `list_jobs`, `tail_logs`, `wait_job`: one view over every run, job stages and conversions.

Everything comes from the run directory (request, stage record, progress, report) and the process table,
so any process can answer, including after a restart of the server that started the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
from pydantic import BaseModel, ValidationError

from mm_agent import procs
from mm_agent.errors import MMAgentError
from mm_agent.jobs.schema import (
    STAGE_FILE,
    STAGES,
    JobList,
    JobProgress,
    JobReport,
    JobRequest,
    JobStatus,
    LogTail,
    StageRecord,
)
from mm_agent.redact import redact, redact_model
from mm_agent.runs import (
    LOG,
    PROGRESS,
    REPORT,
    REQUEST,
    RunProgress,
    RunStatus,
    RunStatusRequest,
    list_runs,
    read_json,
    run_dir_for,
    run_status,
    runs_dir,
)

M = TypeVar("M", bound=BaseModel)
TAIL_BYTES = 512 * 1024
MAX_LINES = 500
LINE_CHARS = 2000


def _model(cls: type[M], path: Path) -> M | None:
    """A run file as its model; None when missing or not (yet) valid."""
    raw = read_json(path)
    if raw is None:
        return None
    try:
        return cls.model_validate(raw)
    except ValidationError:
        return None


def stage_processes(record: StageRecord) -> list[psutil.Process]:
    """The stage's live processes: its group plus the recorded ones that left it (torchrun's workers).

    Nothing survives a reboot: a stage started before it has no processes, whatever now holds its old
    group id (which a leaderless group of strangers could have taken since)."""
    if record.leader.create_time < psutil.boot_time():
        return []
    try:
        group = procs.group_members(record.pgid, record.leader.create_time)
    except MMAgentError:  # the group id now belongs to someone else: none of it is ours
        group = []
    found = {p.pid: p for p in group}
    for proc in procs.verified((p.pid, p.create_time) for p in record.processes):
        found.setdefault(proc.pid, proc)
    return [found[pid] for pid in sorted(found)]


def _from_run(run: RunStatus) -> JobStatus:
    run_dir = Path(run.run_dir)
    status = JobStatus(
        run_id=run.run_id,
        kind=run.kind,
        state=run.state,
        progress=run.progress,
        message=run.progress.message,
        report=run.report,
        supervisor_pid=run.pid,
        started=run.started,
        finished=run.finished,
        run_dir=run.run_dir,
        log=run.log,
        log_tail=[redact(line) for line in run.log_tail],
        stop_hint=run.stop_hint,
    )
    if run.kind not in STAGES:
        if run.report is not None:
            status.message = str(run.report.get("message", ""))
        if run.state == "running":
            status.pids = [run.pid]
        return status
    request = _model(JobRequest, run_dir / REQUEST)
    if request is not None:
        status.stage, status.job_dir, status.runtime = request.stage, request.job_dir, request.runtime
        status.master_port = request.master_port
    progress = _model(JobProgress, run_dir / PROGRESS) or JobProgress()
    report = _model(JobReport, run_dir / REPORT) if run.report is not None else None
    if report is not None:
        progress = report.progress
        status.exit_code, status.root_cause, status.message = (
            report.exit_code,
            report.root_cause,
            report.message,
        )
    else:
        status.message = progress.message
    status.iteration, status.total = progress.iteration, progress.total
    status.last_loss, status.step_time_ms, status.eta_s = (
        progress.last_loss,
        progress.step_time_ms,
        progress.eta_s,
    )
    status.extract_done, status.extract_total = progress.extract_done, progress.extract_total
    done, total = (
        (progress.extract_done, progress.extract_total)
        if progress.extract_total is not None
        else (progress.iteration, progress.total)
    )
    status.progress = RunProgress(
        done=done or 0, total=total or 0, message=status.message, updated=progress.updated
    )
    record = _model(StageRecord, run_dir / STAGE_FILE)
    if record is not None:
        status.pgid = record.pgid
        if run.state in ("running", "killed"):  # a finished supervisor left nothing behind
            status.pids = [p.pid for p in stage_processes(record)]
    if run.state == "killed" and status.pids:
        # Orphans: the ranks keep training (and hold the job, its ports and its save_path) unwatched.
        status.orphans = list(status.pids)
        status.message = (
            f"the supervisor was killed but {len(status.orphans)} stage process(es) still run unwatched "
            f"(PIDs {', '.join(map(str, status.orphans))}); the job cannot be launched again until they stop"
        )
        status.stop_hint = (
            f"the supervisor is gone but {len(status.pids)} stage process(es) still run: "
            f"`mm-agent stop {run.run_id} --yes` (stop_job with confirm=true) stops them"
        )
    return status


def job_status(run_id: str, log_lines: int = 20, root: Path | None = None) -> JobStatus:
    """State, progress (iteration/loss/ETA or samples), root cause when failed, PIDs and the last
    `log_lines` (at most 500) log lines of a run; with `root` (a server's workspace), only of its own runs."""
    if root is not None:
        run_dir_for(run_id, root)
    lines = max(0, min(log_lines, MAX_LINES))
    # every string masked, not only the log lines: a report's message or root cause may quote the log
    return redact_model(_from_run(run_status(RunStatusRequest(run_id=run_id, log_lines=lines))))


def list_jobs() -> JobList:
    """Every run (job stages and conversions), newest first."""
    return JobList(runs_dir=str(runs_dir()), jobs=[redact_model(_from_run(r)) for r in list_runs().runs])


def tail_logs(run_id: str, lines: int = 100, root: Path | None = None) -> LogTail:
    """The last `lines` lines of a run's log: at most 500, each cut to 2000 characters, secrets masked;
    with `root` (a server's workspace), only of its own runs."""
    count = max(1, min(lines, MAX_LINES))
    log = run_dir_for(run_id, root) / LOG
    try:
        with log.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read(size - fh.tell())  # up to `size` exactly: a follower continues from there
    except OSError:
        size, data = 0, b""
    text = data.decode("utf-8", "backslashreplace").splitlines()[-count:]  # non-UTF-8 bytes as \xNN
    return LogTail(run_id=run_id, log=str(log), lines=[redact(t)[:LINE_CHARS] for t in text], size_bytes=size)


def wait_job(
    run_id: str,
    timeout_s: float | None = None,
    on_update: Callable[[JobStatus], None] | None = None,
    poll_s: float = 0.5,
) -> JobStatus:
    """Follow a run until it is no longer running (or `timeout_s` passed), calling `on_update` per poll."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        status = job_status(run_id, log_lines=0)
        if on_update is not None:
            on_update(status)
        if status.state != "running" or (end is not None and time.monotonic() >= end):
            return job_status(run_id)
        time.sleep(poll_s)
