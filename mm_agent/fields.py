"""Bounded field types for every request model a tool takes.

Each string a caller sends has a length cap and each list an item cap, so no request can make a tool do
unbounded work (`tests/security/test_request_bounds.py` walks every tool's input schema for them). Values
that end up in paths, argv or rendered scripts are single-line: NUL, newlines and other control
characters are refused here, before any core function sees them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from mm_agent.errors import MMAgentError
from mm_agent.paths import check_text

PATH_CHARS = 4096  # Linux PATH_MAX
NAME_CHARS = 128
REQUEST_CHARS = 2000  # a request for route_model is a sentence or two
LOG_TEXT_CHARS = 8 * 1024 * 1024  # raw log text handed to diagnose_errors
MAX_PATHS = 256
MAX_ITEMS = 64


def one_line(value: str) -> str:
    """Refuse control characters in a value; pydantic reports the ValueError with the field's location and
    the text carries the fix."""
    try:
        check_text(value, "value")
    except MMAgentError as exc:
        raise ValueError(f"{exc.message}; fix: {exc.fix}") from None
    return value


PathText = Annotated[str, Field(max_length=PATH_CHARS), AfterValidator(one_line)]
"""A file or directory path: one line, at most PATH_MAX characters."""

Name = Annotated[str, Field(max_length=NAME_CHARS), AfterValidator(one_line)]
"""An id or short word (model, task, size, version, check id): one line, at most 128 characters."""
