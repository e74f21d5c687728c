"""Background runs: work that outlives a tool call (weight conversion) with a status anyone can read.

A run is a directory `<state_dir>/runs/<run_id>/` holding what the worker was asked (`request.json`, plus
any other inputs such as `plan.json`), what it says while working (`progress.json`, replaced atomically),
what it ended with (`report.json`, a dict with a `status`; "failed" means it failed) and everything it
printed (`run.log`). `run.json` records the worker's PID and start time so a status call can tell a live
worker from a dead one: a worker that is gone without a report was killed (signal, OOM killer, reboot).
The worker is started with `procs.spawn`, so `mm-agent stop` may stop it and nothing else. Job stages
(`mm_agent.jobs`) are runs too: their worker is a supervisor whose report may also say "stopped".
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.procs import CREATE_TIME_TOLERANCE_S, spawn, state_dir

RunState = Literal["running", "succeeded", "failed", "stopped", "killed"]
RUN_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)
_KIND = re.compile(r"^[a-z0-9]{1,16}$")
LOG_TAIL_LINES = 30
_TAIL_BYTES = 64 * 1024

REQUEST, PROGRESS, REPORT, META, LOG = "request.json", "progress.json", "report.json", "run.json", "run.log"


class RunInfo(BaseModel):
    """What `start_run` started."""

    run_id: str
    kind: str
    run_dir: str
    pid: int
    log: str
    started: str = Field(description="ISO 8601 UTC")


class RunProgress(BaseModel):
    done: int = 0
    total: int = 0
    message: str = ""
    updated: str | None = Field(default=None, description="ISO 8601 UTC time of the last progress write")


class RunStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(pattern=RUN_ID_PATTERN, description="id returned by convert_weights (confirm=true)")
    log_lines: int = Field(
        default=LOG_TAIL_LINES, ge=0, le=500, description="last lines of run.log to return"
    )


class RunStatus(BaseModel):
    run_id: str
    kind: str
    state: RunState = Field(description="killed: the worker is gone without a report (signal, OOM, reboot)")
    progress: RunProgress
    report: dict[str, Any] | None = Field(default=None, description="the worker's final report, when done")
    log_tail: list[str] = Field(default_factory=list)
    pid: int
    started: str
    finished: str | None = None
    run_dir: str
    log: str
    stop_hint: str | None = Field(default=None, description="how to stop it while it runs")


class RunList(BaseModel):
    runs_dir: str
    runs: list[RunStatus] = Field(description="newest first")


class RunMeta(BaseModel):
    """run.json: the worker (for job stages, the supervisor) as started."""

    run_id: str
    kind: str
    argv: list[str]
    pid: int
    create_time: float | None
    started: str
    cwd: str | None
    workspace: str | None = Field(
        default=None,
        description="the MCP server's workspace that started it (None: the CLI, or an older mm-agent)",
    )


def runs_dir() -> Path:
    """Runs live in mm-agent's state directory, next to the process records `stop` trusts."""
    return state_dir() / "runs"


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Mapping[str, Any] | BaseModel) -> None:
    """Temp file in the same directory + os.replace: a reader sees the old file or the new one, never half."""
    text = data.model_dump_json(indent=2) if isinstance(data, BaseModel) else json.dumps(data, indent=2)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _new_id(kind: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{secrets.token_hex(3)}"


def start_run(
    kind: str,
    argv: list[str],
    request: BaseModel,
    root: Path | None = None,
    *,
    inputs: Mapping[str, BaseModel] | None = None,
    new_session: bool = False,
    workspace: Path | None = None,
) -> RunInfo:
    """Start `argv + [run_dir]` in the background as run `kind-<time>-<hex>`.

    `request` is written to request.json and `inputs` to `<name>` files before the worker starts; its
    stdout and stderr go to run.log; `root` is its working directory (the workspace over MCP).
    `new_session` detaches the worker from the caller's terminal (job supervisors outlive the CLI).
    `workspace`: the MCP server's workspace, recorded so that only a server on it answers for the run.
    """
    if not _KIND.match(kind):
        raise MMAgentError(f"bad run kind {kind!r}", field="kind", fix="use lower-case letters and digits")
    base = runs_dir()
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    run_id = _new_id(kind)
    run_dir = base / run_id
    run_dir.mkdir(mode=0o700)
    write_json_atomic(run_dir / REQUEST, request)
    for name, model in (inputs or {}).items():
        write_json_atomic(run_dir / name, model)
    log = run_dir / LOG
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as fh:
        proc = spawn(
            [*argv, str(run_dir)],
            purpose=f"mm-agent {kind} run {run_id}",
            cwd=root,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
    # Reap the worker when it exits so a long-lived server does not collect zombies; the status comes
    # from the run directory, not from this handle.
    threading.Thread(target=proc.wait, name=f"reap-{run_id}", daemon=True).start()
    try:
        create_time: float | None = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = None  # already gone: status reports it from its report (or as killed)
    started = utc_now()
    meta = RunMeta(
        run_id=run_id,
        kind=kind,
        argv=[*argv, str(run_dir)],
        pid=proc.pid,
        create_time=create_time,
        started=started,
        cwd=str(root) if root else None,
        workspace=str(workspace.resolve()) if workspace is not None else None,
    )
    write_json_atomic(run_dir / META, meta)
    return RunInfo(
        run_id=run_id, kind=kind, run_dir=str(run_dir), pid=proc.pid, log=str(log), started=started
    )


def run_dir_for(run_id: str, root: Path | None = None) -> Path:
    """The directory of an existing run; ids are checked so a crafted id cannot leave the runs folder.
    With `root` (an MCP server's workspace), a run of another workspace is refused (`check_owner`)."""
    if not _RUN_ID.match(run_id):
        raise MMAgentError(
            f"invalid run id {run_id!r}", field="run_id", fix="pass an id from `mm-agent jobs` (a-z, 0-9, -)"
        )
    path = runs_dir() / run_id
    if not (path / META).is_file():
        raise MMAgentError(
            f"no run {run_id!r} in {runs_dir()}",
            field="run_id",
            fix="list the runs with `mm-agent jobs` (runs are kept in the state dir until deleted)",
        )
    if root is not None:
        check_owner(read_meta(path), root)
    return path


def check_owner(meta: RunMeta, root: Path) -> None:
    """Refuse a run that the server on workspace `root` did not start. Every server of a user shares one state
    directory, so without this a server would read the logs of, and stop, runs of any other workspace. A run
    with no recorded workspace (started from the CLI, or recorded before workspaces were) belongs to `root`
    when its working directory (a job stage's job directory) lies inside it."""
    root = root.resolve()
    if meta.workspace is not None:
        if Path(meta.workspace) == root:
            return
        raise MMAgentError(
            f"run {meta.run_id} belongs to workspace {meta.workspace}; this server's workspace is {root}, so "
            "it neither reads nor stops that run",
            field="run_id",
            fix=f"use the CLI, which sees every run (`mm-agent status {meta.run_id}`, `mm-agent logs "
            f"{meta.run_id}`, `mm-agent stop {meta.run_id}`), or a server started with `mm-agent serve "
            f"--workspace {shlex.quote(meta.workspace)}`",
        )
    if meta.cwd is not None and Path(meta.cwd).resolve().is_relative_to(root):
        return
    raise MMAgentError(
        f"run {meta.run_id} was started from the CLI"
        + (
            f" for {meta.cwd}, outside this server's workspace {root}" if meta.cwd else ", not by this server"
        ),
        field="run_id",
        fix=f"use the CLI, which sees every run: `mm-agent status {meta.run_id}` (or `mm-agent logs`, "
        "`mm-agent stop` with the same id)",
    )


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def worker_alive(meta: RunMeta) -> bool:
    """The recorded worker still runs (same PID and start time; a zombie counts as gone)."""
    try:
        proc = psutil.Process(meta.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return (
            meta.create_time is None or abs(proc.create_time() - meta.create_time) <= CREATE_TIME_TOLERANCE_S
        )
    except psutil.Error:
        return False


def tail(path: Path, lines: int, max_bytes: int = _TAIL_BYTES) -> list[str]:
    """The last `lines` lines among the file's last `max_bytes` bytes (bounded, whatever the log size)."""
    if lines <= 0:
        return []
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    # bytes that are not UTF-8 (a name from a GBK archive that the job printed) as \xNN, as names are shown
    return data.decode("utf-8", "backslashreplace").splitlines()[-lines:]


def read_meta(run_dir: Path) -> RunMeta:
    try:
        return RunMeta.model_validate(read_json(run_dir / META))
    except ValidationError:
        raise MMAgentError(
            f"{run_dir / META} is not a run record", fix="delete that run directory; it is not mm-agent's"
        ) from None


def _status(run_dir: Path, log_lines: int) -> RunStatus:
    meta = read_meta(run_dir)
    # Read the report before checking the process: a worker that writes it and exits in between is
    # then seen as finished, not killed.
    report = read_json(run_dir / REPORT)
    alive = report is None and worker_alive(meta)
    if report is None and not alive:
        report = read_json(run_dir / REPORT)
    try:
        progress = RunProgress.model_validate(read_json(run_dir / PROGRESS) or {})
    except ValidationError:  # a job stage's progress.json has its own shape (mm_agent.jobs reads it)
        progress = RunProgress()
    finished = None
    state: RunState
    if report is not None:
        ended = report.get("status")
        state = "failed" if ended == "failed" else "stopped" if ended == "stopped" else "succeeded"
        with contextlib.suppress(OSError):
            mtime = (run_dir / REPORT).stat().st_mtime
            finished = dt.datetime.fromtimestamp(mtime, dt.timezone.utc).isoformat(timespec="seconds")
    else:
        state = "running" if alive else "killed"
    hint = None
    if state == "running":
        hint = (
            f"`mm-agent stop {meta.run_id}` (dry run), then `mm-agent stop {meta.run_id} --yes` "
            f"(worker PID {meta.pid})"
        )
    return RunStatus(
        run_id=meta.run_id,
        kind=meta.kind,
        state=state,
        progress=progress,
        report=report,
        log_tail=tail(run_dir / LOG, log_lines),
        pid=meta.pid,
        started=meta.started,
        finished=finished,
        run_dir=str(run_dir),
        log=str(run_dir / LOG),
        stop_hint=hint,
    )


def run_status(req: RunStatusRequest) -> RunStatus:
    """State, progress, final report and log tail of one run."""
    return _status(run_dir_for(req.run_id), req.log_lines)


def list_runs(log_lines: int = 0) -> RunList:
    """Every run in the state dir, newest first (directories that are not runs are skipped)."""
    base = runs_dir()
    found: list[RunStatus] = []
    if base.is_dir():
        for path in base.iterdir():
            if _RUN_ID.match(path.name) and (path / META).is_file():
                with contextlib.suppress(MMAgentError):
                    found.append(_status(path, log_lines))
    found.sort(key=lambda s: (s.started, s.run_id), reverse=True)
    return RunList(runs_dir=str(base), runs=found)


def wait_run(
    run_id: str, on_update: Callable[[RunStatus], None] | None = None, poll_s: float = 0.2
) -> RunStatus:
    """Follow a run until it is no longer running, calling `on_update` on every poll (the CLI's bar)."""
    req = RunStatusRequest(run_id=run_id, log_lines=0)
    while True:
        status = run_status(req)
        if on_update is not None:
            on_update(status)
        if status.state != "running":
            return run_status(RunStatusRequest(run_id=run_id))
        time.sleep(poll_s)
