"""Run a short helper command (an interpreter probe, `npu-smi info`) so that nothing it starts outlives
the call.

`subprocess.run(timeout=)` kills only the direct child: a probe interpreter that started a torchrun, or
a `.pth` file that forked a sleeper, left those running, unrecorded, where `stop_process` would not touch
them. Here the child leads its own process group (`start_new_session`), and every process it starts
carries a random token in its environment. When the child exits, or the timeout ends it, the group is
SIGKILLed and so is every process of ours still carrying the token: that also catches descendants that
moved to a session of their own (torchrun's workers do). The leader is not reaped until then, so its
group id cannot be reused by an unrelated process in between.

A caller that runs several commands from worker threads it may stop waiting for (the doctor answers at
its deadline) passes a `Scope` and closes it before returning: what is still running is killed then, and
nothing starts after. A scope made inside a server call closes itself when the call is cancelled
(`cancel.on_cancel`), and so does a single command run there: an abandoned or cancelled call leaves no
probe running. Every running command is also listed here, so the server's shutdown (the client went away)
kills them all (`kill_all`). Each is killed only until it is reaped, never after (its group id is free then).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from mm_agent import cancel

TOKEN_VAR = "MM_AGENT_CONTAINED"
OUTPUT_LIMIT = 1024 * 1024  # per stream; the rest is read and dropped, so the child never blocks on it
_POLL_S = 0.05
_DRAIN_S = 2.0  # after the child exits (or is killed), time for its pipes to deliver what they hold
_KILL_ROUNDS = 5  # a child forking while we scan is caught by the next round


@dataclass(frozen=True)
class Finished:
    """What the command left: exit status (negative: killed by that signal), output, and whether the
    timeout ended it."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


class _Child:
    """One running command: its group (and its token's carriers) can be killed from any thread until the
    command is reaped; after that, never (its group id may belong to another process by then)."""

    def __init__(self, pgid: int, token: str) -> None:
        self.pgid = pgid
        self.token = token
        self._lock = threading.Lock()
        self._reaped = False

    def kill(self) -> None:
        with self._lock:
            if not self._reaped:
                kill_contained(self.pgid, self.token)

    def last_kill(self) -> None:
        """The final kill, just before the caller reaps the leader; later `kill`s do nothing."""
        with self._lock:
            kill_contained(self.pgid, self.token)
            self._reaped = True


_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, _Child] = {}  # every contained command running in this process, by group id


def kill_all() -> None:
    """Kill every contained command still running, with all it started (the server is going away)."""
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for child in live:
        child.kill()


class Scope:
    """The contained commands of one call: `close()` kills those still running and refuses new ones. Made
    inside a server call, it closes itself when that call is cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._live: dict[int, _Child] = {}
        self._unhook: Callable[[], None] = lambda: None  # (close() may run inside on_cancel, just below)
        self._unhook = cancel.on_cancel(self.close)

    def start(self, popen: Callable[[], subprocess.Popen[bytes]], token: str) -> subprocess.Popen[bytes]:
        with self._lock:  # held across the start, so close() cannot slip in between
            if self._closed:
                raise OSError(errno.ECANCELED, "the call this command belonged to has already returned")
            proc = popen()
            self._live[proc.pid] = _track(proc.pid, token)
            return proc

    def done(self, pgid: int) -> None:
        with self._lock:
            self._live.pop(pgid, None)

    def close(self) -> None:
        self._unhook()
        with self._lock:
            self._closed = True
            live = list(self._live.values())
        for child in live:
            child.kill()


def _track(pgid: int, token: str) -> _Child:
    """List a command just started (once only: a scope's start and run_contained share the record)."""
    with _LIVE_LOCK:
        child = _LIVE.get(pgid)
        if child is None or child.token != token:
            child = _LIVE[pgid] = _Child(pgid, token)
        return child


def run_contained(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str = os.path.sep,
    exec_fd: int | None = None,
    scope: Scope | None = None,
) -> Finished:
    """Run `argv` for at most `timeout_s` seconds; on return, it and everything it started are gone.

    With `exec_fd`, the kernel executes that open descriptor (`/proc/self/fd/N`), while `argv[0]` stays
    the name the program sees: the file checked is the file run, even if its path is swapped meanwhile.
    Raises OSError when the command cannot be started (or `scope` is closed).
    """
    token = secrets.token_hex(16)

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            executable=f"/proc/self/fd/{exec_fd}" if exec_fd is not None else None,
            pass_fds=(exec_fd,) if exec_fd is not None else (),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**(os.environ if env is None else env), TOKEN_VAR: token},
            cwd=cwd,
            start_new_session=True,
        )

    proc = scope.start(popen, token) if scope is not None else popen()
    child = _track(proc.pid, token)
    unhook = cancel.on_cancel(child.kill)  # the call was cancelled: the command ends now
    try:
        out, err, timed_out = _collect(proc, time.monotonic() + timeout_s, token)
    finally:
        unhook()
        child.last_kill()
        with _LIVE_LOCK:
            if _LIVE.get(proc.pid) is child:
                del _LIVE[proc.pid]
        if scope is not None:
            scope.done(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_DRAIN_S)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return Finished(
        returncode=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        timed_out=timed_out,
    )


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid keeps holding the group id)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _collect(proc: subprocess.Popen[bytes], deadline: float, token: str) -> tuple[bytes, bytes, bool]:
    """Read both pipes until the child exits and its pipes close, or the deadline passes."""
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    exited = False
    limit = deadline
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if not exited and _exited(proc.pid):
                exited = True
                kill_contained(proc.pid, token)  # background leftovers would hold the pipes open
                limit = now + _DRAIN_S
            if exited and not sel.get_map():
                break
            if now >= limit:
                break
            for key, _ in sel.select(min(_POLL_S, limit - now)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = buffers[key.fd]
                buf += chunk[: max(0, OUTPUT_LIMIT - len(buf))]
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), not exited


def _carrying(token: str) -> list[psutil.Process]:
    """Our own live processes whose environment carries `token` (others' environments are unreadable)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(TOKEN_VAR) == token:
                found.append(proc)
    return found


def kill_contained(pgid: int, token: str) -> None:
    """SIGKILL the process group `pgid` and every process carrying `token`, until none is left."""
    for _ in range(_KILL_ROUNDS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        left = _carrying(token)
        if not left:
            return
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
