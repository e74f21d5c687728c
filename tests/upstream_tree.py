"""MindSpeed-MM's source for tests outside tests/fidelity that read one file of it: the tree under
`$MM_UPSTREAM`, or a skip that says how to point it there (tests/fidelity/conftest.py for the full oracle)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def mindspeed_mm_tree(version: str, purpose: str) -> Path:
    """`$MM_UPSTREAM/MindSpeed-MM/<version>` (e.g. "v26.0.0"); skips, naming `purpose`, when it is not there."""
    root = os.environ.get("MM_UPSTREAM")
    if not root:
        pytest.skip(
            f"MM_UPSTREAM is not set: point it at a folder holding MindSpeed-MM/{version}/ "
            f"(e.g. MM_UPSTREAM=../shared/upstream, as .ci/run does) to {purpose}"
        )
    path = Path(root).expanduser() / "MindSpeed-MM" / version
    if not path.is_dir():
        pytest.skip(f"{path} is missing: MM_UPSTREAM must hold MindSpeed-MM/{version}/ to {purpose}")
    return path
