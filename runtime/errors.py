"""The one error type the runtime's users see, and the entry-point wrapper that prints it.

A bad config file, field or path is the user's to fix, so it must read as a message with the fix, never a
traceback. Entry points (`python -m runtime.x`) wrap their `main` in `run_main`, which turns a
`RuntimeFailure` into `error:` / `file:` / `field:` / `fix:` lines on stderr and exit status 2 — the same
shape as mm-agent's `MMAgentError`, so the job manager and the diagnoser read both alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from mm_agent.errors import MMAgentError


class RuntimeFailure(MMAgentError):
    """A failure caused by the user's input or environment, with where it is and how to fix it.

    mm-agent's error with the runtime's line-per-part rendering (what `run_main` prints).
    """

    def render(self) -> str:
        """The lines `run_main` prints: the message first, then only the parts that are known."""
        lines = [f"error: {self.message}"]
        if self.file:
            lines.append(f"file: {self.file}")
        if self.field:
            lines.append(f"field: {self.field}")
        if self.fix:
            lines.append(f"fix: {self.fix}")
        return "\n".join(lines)


def run_main(main: Callable[[list[str] | None], int]) -> NoReturn:
    """Run an entry point's `main(None)` and exit with its status; a `RuntimeFailure` exits 2 with no traceback."""
    try:
        code = main(None)
    except RuntimeFailure as exc:
        sys.stdout.flush()
        print(exc.render(), file=sys.stderr, flush=True)
        sys.exit(2)
    sys.exit(code)
