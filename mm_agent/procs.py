"""Process safety: who holds a port or an NPU, and the only place in mm-agent that may signal a process.

mm-agent records every process it starts (PID, psutil create_time, command line, purpose) in its state
directory. A stop is offered, and performed, only for a process whose record still matches the live process
(same PID *and* create_time *and* command line), so a recycled PID or a process someone else started is
never signalled: for those we report PID, user and command line and say what the user can do by hand.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mm_agent.errors import MMAgentError

# psutil derives create_time from boot time + start ticks; boot time may drift by up to a second between
# reads on some kernels, so records match within this tolerance (the command line must match as well).
CREATE_TIME_TOLERANCE_S = 1.0

_TRAINING_SCRIPT = re.compile(r"^(pretrain|posttrain|inference|evaluate)_\w+\.py$")
_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


class ProcRecord(BaseModel):
    """What mm-agent wrote down when it started (or adopted) a process."""

    model_config = ConfigDict(extra="ignore")

    pid: int
    create_time: float
    cmdline: list[str]
    purpose: str
    started_at: str = Field(description="ISO 8601 UTC time the record was written")
    user: str
    cwd: str | None = None


class ProcInfo(BaseModel):
    """A live process as mm-agent reports it, with what may be done about it."""

    pid: int
    user: str | None = Field(default=None, description="owner, None when not visible")
    cmdline: list[str] = Field(default_factory=list)
    create_time: float | None = None
    age_s: float | None = Field(default=None, description="seconds since the process started")
    started_by_mm_agent: bool = False
    purpose: str | None = Field(default=None, description="why mm-agent started it (its own processes)")
    stop_hint: str = Field(
        description="how to stop it: `mm-agent stop` for mm-agent's own, else a manual fix"
    )

    @property
    def command(self) -> str:
        return shlex.join(self.cmdline) if self.cmdline else "<command line not visible>"


class DeviceHolder(BaseModel):
    """A process using an NPU, from the `npu-smi info` process table or /dev/davinci* file handles."""

    device: str = Field(description="NPU id (npu-smi) or device node (/dev/davinciN)")
    memory_mb: int | None = None
    process: ProcInfo


class ProcessList(BaseModel):
    """Processes mm-agent started that are still running (what `stop` can act on)."""

    state_dir: str
    processes: list[ProcInfo]


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pid: int = Field(ge=1, description="PID of a process mm-agent started (see `mm-agent ps`)")
    confirm: bool = Field(default=False, description="false: dry run (say what would be signalled)")
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="wait after SIGTERM before SIGKILL")


class StopResult(BaseModel):
    pid: int
    status: Literal["dry_run", "stopped", "not_running"]
    cmdline: list[str] = Field(default_factory=list)
    purpose: str | None = None
    targets: list[int] = Field(default_factory=list, description="the process and its children")
    killed: list[int] = Field(default_factory=list, description="PIDs that needed SIGKILL after the timeout")
    message: str


# ---------------------------------------------------------------------------------------------------------
# state directory and records


def state_dir() -> Path:
    """`$MM_AGENT_STATE_DIR`, else `$XDG_STATE_HOME/mm-agent`, else `~/.local/state/mm-agent`."""
    explicit = os.environ.get("MM_AGENT_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "mm-agent"


def _procs_dir(create: bool = False) -> Path:
    path = state_dir() / "procs"
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _write_record(record: ProcRecord) -> Path:
    folder = _procs_dir(create=True)
    target = folder / f"{record.pid}-{record.create_time:.2f}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(record.model_dump_json(indent=2))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def record(pid: int, purpose: str) -> ProcRecord:
    """Record a running process that mm-agent code started some other way (so `stop` may act on it)."""
    try:
        proc = psutil.Process(pid)
        create_time, cmdline, cwd = proc.create_time(), proc.cmdline(), _safe(proc.cwd)
        # Popen may return while the child is still inside execve (vfork), when /proc/PID/cmdline is
        # briefly empty: wait for the new program's command line, the identity `stop` compares later.
        for _ in range(200):
            if cmdline:
                break
            time.sleep(0.005)
            cmdline = proc.cmdline()
    except psutil.NoSuchProcess:
        raise MMAgentError(f"no process with PID {pid}", field="pid", fix="record it while it runs") from None
    except psutil.AccessDenied:
        raise MMAgentError(
            f"PID {pid} belongs to another user", field="pid", fix="only record processes you started"
        ) from None
    rec = ProcRecord(
        pid=pid,
        create_time=create_time,
        cmdline=cmdline,
        purpose=purpose,
        started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        user=_user(),
        cwd=cwd,
    )
    _write_record(rec)
    return rec


def spawn(
    argv: list[str],
    *,
    purpose: str,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    start_new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `argv` (never through a shell) and record it, so `mm-agent stop` can later act on it.

    `start_new_session` detaches it from the caller's terminal and process group (a job supervisor must
    outlive the CLI call that started it and must not get the terminal's Ctrl-C).
    """
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise MMAgentError("spawn needs a non-empty list of string arguments", field="argv")
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL if start_new_session else None,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
    )
    with contextlib.suppress(MMAgentError):  # it already exited: nothing to record
        record(proc.pid, purpose)
    return proc


def _read_records() -> list[tuple[Path, ProcRecord]]:
    folder = _procs_dir()
    if not folder.is_dir():
        return []
    out: list[tuple[Path, ProcRecord]] = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append((path, ProcRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))))
        except (OSError, ValueError, ValidationError):
            continue  # a foreign or half-written file: never act on it
    return out


def _matches(rec: ProcRecord, proc: psutil.Process) -> tuple[bool, str]:
    """Whether `proc` is still the process `rec` describes; the reason when it is not."""
    try:
        with proc.oneshot():
            create_time, cmdline = proc.create_time(), proc.cmdline()
    except psutil.NoSuchProcess:
        return False, "it has exited"
    except psutil.AccessDenied:
        return False, "it is not visible to this user"
    if abs(create_time - rec.create_time) > CREATE_TIME_TOLERANCE_S:
        started = dt.datetime.fromtimestamp(create_time).isoformat(timespec="seconds")
        return False, (
            f"PID {rec.pid} now belongs to a process started at {started}, not the one mm-agent recorded "
            f"at {rec.started_at}: the PID was reused"
        )
    if cmdline != rec.cmdline:
        return False, f"its command line changed from {shlex.join(rec.cmdline)!r} to {shlex.join(cmdline)!r}"
    return True, ""


def live_records() -> dict[int, ProcRecord]:
    """Records whose process is still the recorded one; records of dead or recycled PIDs are pruned."""
    live: dict[int, ProcRecord] = {}
    for path, rec in _read_records():
        try:
            same, _ = _matches(rec, psutil.Process(rec.pid))
        except psutil.NoSuchProcess:
            same = False
        if same:
            live[rec.pid] = rec
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return live


# ---------------------------------------------------------------------------------------------------------
# describing processes


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except (psutil.Error, OSError):
        return None


def _owner(proc: psutil.Process, records: Mapping[int, ProcRecord]) -> tuple[ProcRecord | None, int | None]:
    """The record of `proc` itself or of its nearest recorded ancestor (torchrun workers belong to torchrun)."""
    if proc.pid in records:
        return records[proc.pid], proc.pid
    for parent in _safe(proc.parents) or []:
        if parent.pid in records:
            return records[parent.pid], parent.pid
    return None, None


def _foreign_hint(pid: int, user: str | None, command: str) -> str:
    me = _user()
    who = f"user {user}" if user else "an unknown user"
    if user and user != me:
        return (
            f"PID {pid} ({who}: {command}) was not started by mm-agent and is not yours: ask {user} or an "
            "administrator to stop it, or choose another port/device."
        )
    return (
        f"PID {pid} ({who}: {command}) was not started by mm-agent, so mm-agent will not stop it. If it is a "
        f"leftover of yours, check with `ps -o pid,user,etime,args -p {pid}`, then `kill {pid}` "
        f"(and `kill -9 {pid}` only if it ignores SIGTERM)."
    )


def describe(proc: psutil.Process, records: Mapping[int, ProcRecord] | None = None) -> ProcInfo:
    """ProcInfo for a live process, with the stop hint that fits who started it."""
    records = live_records() if records is None else records
    with proc.oneshot():
        user = _safe(proc.username)
        cmdline = _safe(proc.cmdline) or []
        create_time = _safe(proc.create_time)
    rec, root_pid = _owner(proc, records)
    info = ProcInfo(
        pid=proc.pid,
        user=user,
        cmdline=cmdline,
        create_time=create_time,
        age_s=round(time.time() - create_time, 1) if create_time else None,
        started_by_mm_agent=rec is not None,
        purpose=None
        if rec is None
        else rec.purpose
        if root_pid == proc.pid
        else f"child of {root_pid}: {rec.purpose}",
        stop_hint="",
    )
    if rec is not None:
        info.stop_hint = f"started by mm-agent: `mm-agent stop {root_pid}` (dry run), then `mm-agent stop {root_pid} --yes`"
    else:
        info.stop_hint = _foreign_hint(proc.pid, user, info.command)
    return info


def describe_pid(pid: int, records: Mapping[int, ProcRecord], name: str | None = None) -> ProcInfo:
    """ProcInfo for a PID that may not be visible here (`name` from npu-smi fills in the command)."""
    try:
        return describe(psutil.Process(pid), records)
    except psutil.NoSuchProcess:
        shown = name or "<unknown>"
        return ProcInfo(
            pid=pid,
            cmdline=[name] if name else [],
            stop_hint=(
                f"PID {pid} ({shown}) is not visible from here (another container or PID namespace?): "
                "stop it where it runs."
            ),
        )


def list_processes() -> ProcessList:
    """mm-agent's own processes that are still alive."""
    records = live_records()
    procs = []
    for pid in sorted(records):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(describe(psutil.Process(pid), records))
    return ProcessList(state_dir=str(state_dir()), processes=procs)


# ---------------------------------------------------------------------------------------------------------
# ports


def listening_ports() -> dict[int, set[int | None]]:
    """TCP ports in LISTEN state on any address -> PIDs holding them (None: owner not visible to us)."""
    table: dict[int, set[int | None]] = {}
    try:
        conns: Iterable[Any] = psutil.net_connections(kind="tcp")
        owners: list[tuple[Any, int | None]] = [(c, c.pid) for c in conns]
    except psutil.AccessDenied:  # macOS and hardened kernels: fall back to the processes we can inspect
        owners = []
        for proc in psutil.process_iter():
            owners += [(c, proc.pid) for c in _safe(lambda p=proc: p.net_connections(kind="tcp")) or []]
    for conn, pid in owners:
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            table.setdefault(conn.laddr.port, set()).add(pid)
    return table


def port_holders(
    port: int,
    *,
    listeners: Mapping[int, set[int | None]] | None = None,
    records: Mapping[int, ProcRecord] | None = None,
) -> list[ProcInfo]:
    """Processes listening on `port` (any address). Sockets whose owner is invisible are left out; use
    `port_free` to know whether the port is taken at all."""
    listeners = listening_ports() if listeners is None else listeners
    records = live_records() if records is None else records
    pids = sorted(p for p in listeners.get(port, set()) if p is not None)
    return [describe_pid(pid, records) for pid in pids]


def port_free(port: int, *, listeners: Mapping[int, set[int | None]] | None = None) -> bool:
    listeners = listening_ports() if listeners is None else listeners
    return port not in listeners


# ---------------------------------------------------------------------------------------------------------
# devices


def _davinci_holders(records: Mapping[int, ProcRecord]) -> list[DeviceHolder]:
    nodes = {str(p) for p in Path("/dev").glob("davinci[0-9]*")}
    if not nodes:
        return []
    holders: list[DeviceHolder] = []
    for proc in psutil.process_iter():
        fd_dir = Path(f"/proc/{proc.pid}/fd")
        try:
            targets = {os.readlink(fd_dir / fd) for fd in os.listdir(fd_dir)}
        except OSError:  # not ours to read, or gone
            continue
        for node in sorted(targets & nodes):
            holders.append(DeviceHolder(device=node, process=describe_pid(proc.pid, records)))
    return holders


def device_holders(
    records: Mapping[int, ProcRecord] | None = None, timeout_s: float = 2.5
) -> list[DeviceHolder]:
    """Processes using NPUs: the `npu-smi info` process table when npu-smi exists, else open
    /dev/davinci* handles (readable for our own processes, or all as root); empty without NPUs."""
    from mm_agent.npu_smi import query

    records = live_records() if records is None else records
    smi = query(timeout_s=timeout_s)
    if smi is not None and smi.error is None:
        return [
            DeviceHolder(
                device=f"NPU {p.npu} chip {p.chip}",
                memory_mb=p.memory_mb,
                process=describe_pid(p.pid, records, p.name),
            )
            for p in smi.processes
        ]
    return _davinci_holders(records)


# ---------------------------------------------------------------------------------------------------------
# stale training processes


def _program(cmdline: list[str]) -> tuple[str, str | None]:
    """(executable basename, script or `-m` module it runs) for a command line."""
    if not cmdline:
        return "", None
    exe = os.path.basename(cmdline[0])
    if not exe.startswith("python"):
        return exe, None
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "-m":
            return exe, next(args, None)
        if arg in {"-c"}:
            return exe, None
        if arg.startswith("-"):
            if arg in {"-W", "-X", "-Q"}:
                next(args, None)
            continue
        return exe, arg
    return exe, None


def is_training_command(cmdline: list[str]) -> bool:
    """torchrun, `python -m torch.distributed.run`, MM entry scripts (pretrain_*.py, inference_*.py, ...)
    or anything MindSpeed runs."""
    exe, target = _program(cmdline)
    if exe == "torchrun":
        return True
    if target is None:
        return False
    if target in _TORCHRUN_MODULES:
        return True
    return bool(_TRAINING_SCRIPT.match(os.path.basename(target))) or "mindspeed" in target.lower()


def stale_training_processes(records: Mapping[int, ProcRecord] | None = None) -> list[ProcInfo]:
    """Training-like processes currently running (ours and everyone's that is visible), oldest first."""
    records = live_records() if records is None else records
    me = psutil.Process()
    skip = {me.pid, *(p.pid for p in _safe(me.parents) or [])}
    found: list[ProcInfo] = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid in skip or not is_training_command(cmdline):
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(describe(proc, records))
    return sorted(found, key=lambda p: p.create_time or 0.0)


# ---------------------------------------------------------------------------------------------------------
# stopping


def stop_process(req: StopRequest) -> StopResult:
    """Stop a process mm-agent started (and its children): dry run unless `confirm`; SIGTERM, wait
    `timeout_s`, then SIGKILL. Anything without a matching record is refused and never signalled."""
    pid = req.pid
    recs = [(path, rec) for path, rec in _read_records() if rec.pid == pid]
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            raise psutil.NoSuchProcess(pid)
    except psutil.NoSuchProcess:
        for path, _ in recs:
            with contextlib.suppress(OSError):
                path.unlink()
        return StopResult(pid=pid, status="not_running", message=f"no process with PID {pid} is running")
    if not recs:
        info = describe_pid(pid, {})
        raise MMAgentError(
            f"PID {pid} was not started by mm-agent (no record under {_procs_dir()}); refusing to signal it",
            field="pid",
            fix=info.stop_hint,
        )
    reasons = []
    for path, rec in recs:
        same, why = _matches(rec, proc)
        if same:
            return _stop(proc, rec, path, req)
        reasons.append(why)
        with contextlib.suppress(OSError):
            path.unlink()  # the recorded process is gone; its record is stale
    info = describe_pid(pid, {})
    raise MMAgentError(
        f"refusing to signal PID {pid}: {'; '.join(reasons)}",
        field="pid",
        fix=info.stop_hint,
    )


def _stop(proc: psutil.Process, rec: ProcRecord, path: Path, req: StopRequest) -> StopResult:
    children = _safe(lambda: proc.children(recursive=True)) or []
    targets = [proc, *children]
    target_pids = [p.pid for p in targets]
    command = shlex.join(rec.cmdline)
    if not req.confirm:
        return StopResult(
            pid=proc.pid,
            status="dry_run",
            cmdline=rec.cmdline,
            purpose=rec.purpose,
            targets=target_pids,
            message=(
                f"would send SIGTERM to PID {proc.pid} ({command}) and {len(children)} child process(es), "
                f"then SIGKILL after {req.timeout_s:g} s to any still running; pass confirm=true (CLI: --yes)"
            ),
        )
    for p in targets:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)  # psutil refuses if the PID was reused in the meantime
    _, alive = psutil.wait_procs(targets, timeout=req.timeout_s)
    alive = [p for p in alive if _safe(p.status) not in (None, psutil.STATUS_ZOMBIE)]  # zombies are dead
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if alive:
        psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(OSError):
        path.unlink()
    killed = [p.pid for p in alive]
    extra = f"; SIGKILL needed for {killed}" if killed else ""
    return StopResult(
        pid=proc.pid,
        status="stopped",
        cmdline=rec.cmdline,
        purpose=rec.purpose,
        targets=target_pids,
        killed=killed,
        message=f"stopped PID {proc.pid} ({command}) and {len(children)} child process(es){extra}",
    )


# ---------------------------------------------------------------------------------------------------------
# process groups (job stages)


class GroupStop(BaseModel):
    """What `stop_group` signalled."""

    targets: list[int] = Field(description="PIDs that were alive and were sent SIGTERM")
    killed: list[int] = Field(description="PIDs still alive after the timeout, sent SIGKILL")


def _same_start(proc: psutil.Process, create_time: float) -> bool:
    try:
        return abs(proc.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S
    except psutil.Error:
        return False


def group_members(pgid: int, leader_create_time: float) -> list[psutil.Process]:
    """Live processes of the process group mm-agent started as `pgid` (its leader's start time recorded).

    A PGID stays reserved while any member lives, so the group cannot be a stranger's unless the leader
    PID itself was reused, which the start time reveals: that is refused, never signalled.
    """
    try:
        leader_start: float | None = psutil.Process(pgid).create_time()
    except psutil.NoSuchProcess:
        leader_start = None  # the leader exited; members it left keep the group id reserved
    if leader_start is not None and abs(leader_start - leader_create_time) > CREATE_TIME_TOLERANCE_S:
        raise MMAgentError(
            f"process group {pgid} now belongs to a process mm-agent did not start (the PID was reused)",
            field="pgid",
            fix="nothing of that run is left to stop",
        )
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


def verified(processes: Iterable[tuple[int, float]]) -> list[psutil.Process]:
    """The recorded (PID, start time) pairs that still name the same live process (zombies excluded)."""
    alive = []
    for pid, create_time in processes:
        try:
            proc = psutil.Process(pid)
            if _same_start(proc, create_time) and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def stop_group(
    pgid: int, leader_create_time: float, extra: Iterable[psutil.Process], timeout_s: float
) -> GroupStop:
    """SIGTERM process group `pgid` and the `extra` processes (descendants that left the group, such as
    torchrun's workers, which run in sessions of their own), wait `timeout_s`, then SIGKILL what is left.

    Only the group mm-agent started (checked by `group_members`) and processes the caller verified as
    its own are signalled; `killpg` also reaches members forked after the listing.
    """
    members = group_members(pgid, leader_create_time)
    targets = {p.pid: p for p in [*members, *extra]}
    if members:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    for proc in targets.values():
        if proc.pid not in {m.pid for m in members}:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGTERM)  # psutil refuses a PID reused in the meantime
    _, alive = psutil.wait_procs(list(targets.values()), timeout=timeout_s)
    alive = [p for p in alive if _safe(p.status) not in (None, psutil.STATUS_ZOMBIE)]
    late = group_members(pgid, leader_create_time) if members else []
    if late:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    killed = sorted({p.pid for p in [*alive, *late]})
    if killed:
        psutil.wait_procs([*alive, *late], timeout=5)
    return GroupStop(targets=sorted(targets), killed=killed)
