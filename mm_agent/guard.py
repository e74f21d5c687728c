"""How the MCP server runs every core function: off the event loop, bounded in time and in number.

Each call runs on a daemon thread with the operator's allowed roots and its own cancellation token
(`cancel.Token`) in force, at most `threads` at a time (the rest wait their turn, within their own time
limit). A call that runs out of time, or that the client cancels, is answered at once (a timeout with an
error naming the limit and saying its work was cancelled), and its token is cancelled: its loops stop at
their next `cancel.check()`, and what it started (pool workers, contained probes) is ended by the token's
hooks. Until its thread has really ended, that work still holds one of `threads + abandoned` work slots,
so a flood of calls that time out cannot pile up unbounded work; a new call waits for a work slot too.
The threads are daemons, so even work stuck in the kernel cannot keep the server from exiting, and stuck
calls can never take its threads away: a finished thread waits for the next call (starting one costs more
than a short call), a new one starts when none is free. `shutdown()` (the client went away) cancels every
call still running and waits briefly for their hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from mm_agent import cancel, contained
from mm_agent.errors import MMAgentError
from mm_agent.paths import allowed_roots

T = TypeVar("T")
TOOL_TIMEOUT_S = (
    300.0  # a call that takes longer is answered with an error (long work runs in the background)
)
THREADS = 8  # calls running at once
ABANDONED = 8  # more work slots, for abandoned calls whose work has not stopped yet
SHUTDOWN_WAIT_S = 5.0  # how long shutdown() waits for cancelled work's hooks (pool workers killed, probes)


def _settle(
    loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], result: Any, exc: BaseException | None
) -> None:
    """Hand a thread's outcome to the awaiting task, unless that task gave up (timed out, cancelled)."""

    def settle() -> None:
        if done.done():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)

    with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits for this answer any more
        loop.call_soon_threadsafe(settle)


class _Threads:
    """Daemon threads kept between calls. `submit` hands a job to a free one, or starts one when none is
    free; a thread whose call was abandoned is simply not free until that call ends; a free thread ends
    after `idle_s` without work."""

    def __init__(self, idle_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._free:
                self._free -= 1  # a free thread takes it
                self._jobs.put(job)
                return
        threading.Thread(target=self._serve, args=(job,), name="mm-agent-call", daemon=True).start()

    def _serve(self, job: Callable[[], None]) -> None:
        while True:
            job()  # never raises: Guard.run's work() hands every outcome over
            with self._lock:
                self._free += 1
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    try:  # a job queued just as the wait ran out is still this thread's to run
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        self._free -= 1
                        return


class Guard:
    def __init__(
        self,
        allowed: tuple[Path, ...],
        timeout_s: float = TOOL_TIMEOUT_S,
        threads: int = THREADS,
        abandoned: int = ABANDONED,
    ) -> None:
        self.allowed = allowed
        self.timeout_s = timeout_s
        self.threads = threads
        self.slots = threads + abandoned
        self._limiter: anyio.CapacityLimiter | None = None  # calls being waited for
        # calls whose thread has not ended, abandoned or not
        self._working: anyio.CapacityLimiter | None = None
        self._threads = _Threads()
        self._lock = threading.Lock()
        self._live: set[cancel.Token] = set()  # tokens of the calls whose thread has not ended

    async def run(
        self, fn: Callable[[], T], wrap: Callable[[Callable[[], T]], T], timeout_s: float | None = None
    ) -> T:
        """`wrap(fn)` on a daemon thread with the allowed roots and a cancellation token in force; an error
        after `timeout_s`, and the token cancelled when nobody waits for the answer any more."""
        if self._limiter is None or self._working is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
            self._working = anyio.CapacityLimiter(self.slots)
        limiter, working = self._limiter, self._working
        limit = self.timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        token = cancel.Token()
        started = False
        why = "cancelled by the client"

        def work() -> None:
            try:
                with allowed_roots(self.allowed), cancel.bound(token):
                    token.check()  # cancelled before it began (the server is shutting down)
                    result = wrap(fn)
            except BaseException as exc:
                _settle(loop, done, None, exc)
            else:
                _settle(loop, done, result, None)
            finally:
                with self._lock:
                    self._live.discard(token)
                with contextlib.suppress(RuntimeError):  # the event loop is gone, and its limiters with it
                    loop.call_soon_threadsafe(working.release_on_behalf_of, token)

        try:
            with anyio.fail_after(limit):
                await working.acquire_on_behalf_of(token)
                try:
                    async with limiter:
                        with self._lock:
                            self._live.add(token)
                        started = True
                        self._threads.submit(work)
                        return await done
                finally:
                    if not started:
                        working.release_on_behalf_of(token)
        except TimeoutError:
            why = f"abandoned after {limit:g} s"
            if not started:
                raise ToolError(
                    MMAgentError(
                        f"the call did not finish within {limit:g} s: it waited the whole time for a free "
                        f"slot ({self.threads} calls run at once, and calls abandoned at their time limit keep "
                        f"one of {self.slots} slots until their work has stopped)",
                        fix="retry in a moment (an abandoned call frees its slot once its work has stopped); "
                        "the server operator can raise the limit with `mm-agent serve --tool-timeout S`",
                    ).render()
                ) from None
            raise ToolError(
                MMAgentError(
                    f"the call did not finish within {limit:g} s and was abandoned; its work was cancelled "
                    "(it stops at its next step, and what it started is ended)",
                    fix="retry with a smaller input (fewer or smaller files); the CLI has no time limit, and "
                    "the server operator can raise it with `mm-agent serve --tool-timeout S`",
                ).render()
            ) from None
        finally:
            if started and (not done.done() or done.cancelled()):  # nobody waits for this work any more
                _cancel_soon(token, why)

    def shutdown(self, reason: str = "the server is shutting down") -> None:
        """Cancel every call still running (its hooks end what it started), kill whatever contained process
        is left, and wait up to `SHUTDOWN_WAIT_S` for the hooks."""
        with self._lock:
            live = list(self._live)
        for token in live:
            _cancel_soon(token, reason)
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        for token in live:
            token.settled(max(0.0, deadline - time.monotonic()))
        contained.kill_all()


def _cancel_soon(token: cancel.Token, reason: str) -> None:
    """Cancel `token` on a thread of its own: its hooks kill processes, which must not hold up the event loop."""
    threading.Thread(target=token.cancel, args=(reason,), name="mm-agent-cancel", daemon=True).start()
