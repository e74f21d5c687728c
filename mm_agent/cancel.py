"""Cooperative cancellation of a tool call's work.

The server answers a call that runs past `--tool-timeout` (or that the client cancels) at once, but the
thread doing the work cannot be killed: before this, it went on to the end, with its process pool and its
memory (12 abandoned `prepare_dataset` calls kept 16 pool workers and 2.5 GB growing for minutes). Now
`guard.Guard` gives each call a `Token` (in force for the call's thread through a context variable, as the
allowed roots are) and cancels it when it stops waiting. Long loops call `check()`, which raises
`Cancelled` once the token is cancelled (the scans of prepare_dataset, validate and diagnose, the
resources walk); what blocks on other processes registers a hook with `on_cancel` that ends them at once
(prepare_dataset's pool workers, the doctor's contained probes). With no token (the CLI, tests calling the
core) nothing is ever cancelled and `check()` costs one context-variable read.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from mm_agent.errors import MMAgentError


class Cancelled(MMAgentError):
    """Raised by `check()` in a call whose token was cancelled; nobody waits for its answer any more."""


class Token:
    """Whether one call's work should stop, and what to do at once when it should (`on_cancel` hooks)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._done = threading.Event()  # set once the hooks have run
        self._lock = threading.Lock()
        self._hooks: dict[int, Callable[[], None]] = {}
        self._next = 0
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str) -> None:
        """Mark the work cancelled and run every hook once (in this thread); later calls do nothing."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            hooks = list(self._hooks.values())
            self._hooks.clear()
        try:
            for hook in hooks:
                with contextlib.suppress(Exception):  # one failing hook must not spare the others
                    hook()
        finally:
            self._done.set()

    def settled(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a cancellation's hooks to have run; whether they have."""
        return self._done.wait(timeout_s)

    def on_cancel(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run `hook` when the token is cancelled (now, if it already is); returns the call that removes it."""
        with self._lock:
            if not self._event.is_set():
                key = self._next
                self._next += 1
                self._hooks[key] = hook

                def remove() -> None:
                    with self._lock:
                        self._hooks.pop(key, None)

                return remove
        hook()
        return lambda: None

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled(
                f"the call was cancelled ({self.reason})",
                fix="nothing to do: its work has stopped; call again, with a smaller input if it timed out",
            )


_CURRENT: ContextVar[Token | None] = ContextVar("mm_agent_cancel", default=None)


def current() -> Token | None:
    """The token of the call this thread works for (None outside the server)."""
    return _CURRENT.get()


def check() -> None:
    """Raise `Cancelled` if the current call was cancelled; call it in every long loop."""
    token = _CURRENT.get()
    if token is not None:
        token.check()


@contextlib.contextmanager
def bound(token: Token) -> Iterator[Token]:
    """Make `token` the current one for the work run inside."""
    reset = _CURRENT.set(token)
    try:
        yield token
    finally:
        _CURRENT.reset(reset)


def on_cancel(hook: Callable[[], None]) -> Callable[[], None]:
    """`Token.on_cancel` on the current token; with none, nothing (and the returned remover does nothing)."""
    token = _CURRENT.get()
    return token.on_cancel(hook) if token is not None else (lambda: None)
