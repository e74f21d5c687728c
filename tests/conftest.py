"""Fixtures shared by test files."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes this test started; whatever is still running at the end is killed (they are ours)."""
    children: list[subprocess.Popen[bytes]] = []
    yield children
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
