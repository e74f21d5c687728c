"""How the MCP server runs every core function: off the event loop, bounded in time and in number.

Each call runs on a daemon thread with the operator's allowed roots in force, at most `threads` at a time
(the rest wait their turn, within their own time limit). A call that runs out of time is answered with an
error naming the limit at once, and its slot is freed; its thread is abandoned and finishes on its own
(every write mm-agent makes is atomic). The threads are daemons, so even work stuck in the kernel cannot
keep the server from exiting, and stuck calls can never take its threads away: a finished thread waits
for the next call (starting one costs more than a short call), a new one starts when none is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from mm_agent.errors import MMAgentError
from mm_agent.paths import allowed_roots

T = TypeVar("T")
TOOL_TIMEOUT_S = (
    300.0  # a call that takes longer is answered with an error (long work runs in the background)
)
THREADS = 8  # calls running at once


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
        self, allowed: tuple[Path, ...], timeout_s: float = TOOL_TIMEOUT_S, threads: int = THREADS
    ) -> None:
        self.allowed = allowed
        self.timeout_s = timeout_s
        self.threads = threads
        self._limiter: anyio.CapacityLimiter | None = None
        self._threads = _Threads()

    async def run(
        self, fn: Callable[[], T], wrap: Callable[[Callable[[], T]], T], timeout_s: float | None = None
    ) -> T:
        """`wrap(fn)` on a daemon thread with the allowed roots in force; an error after `timeout_s`."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        limit = self.timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            try:
                with allowed_roots(self.allowed):
                    result = wrap(fn)
            except BaseException as exc:
                _settle(loop, done, None, exc)
            else:
                _settle(loop, done, result, None)

        try:
            with anyio.fail_after(limit):
                async with self._limiter:
                    self._threads.submit(work)
                    return await done
        except TimeoutError:
            raise ToolError(
                MMAgentError(
                    f"the call did not finish within {limit:g} s and was abandoned",
                    fix="retry with a smaller input (fewer or smaller files); the CLI has no time limit, and "
                    "the server operator can raise it with `mm-agent serve --tool-timeout S`",
                ).render()
            ) from None
