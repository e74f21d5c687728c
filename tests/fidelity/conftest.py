"""The oracle for fidelity tests: MindSpeed-MM's, MindSpeed's and Megatron's real source, read and run.

`MM_UPSTREAM` names a folder laid out like `../shared/upstream` (`MindSpeed-MM/v26.0.0/`, `MindSpeed/<branch>/`,
`Megatron-LM/core_v0.12.1/`); `.ci/run` points it there. Without it these tests skip, saying how to point it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SKIP_REASON = (
    "MM_UPSTREAM is not set: point it at a folder holding MindSpeed-MM/<version>/ trees "
    "(e.g. MM_UPSTREAM=../shared/upstream, as .ci/run does) to judge mm-agent against MindSpeed-MM's own code"
)


def upstream_root() -> Path | None:
    """The upstream folder named by MM_UPSTREAM, or None when it is unset or missing."""
    value = os.environ.get("MM_UPSTREAM")
    if not value:
        return None
    root = Path(value).expanduser().resolve()
    return root if (root / "MindSpeed-MM").is_dir() else None


@pytest.fixture(scope="session")
def upstream() -> Path:
    root = upstream_root()
    if root is None:
        pytest.skip(SKIP_REASON)
    return root


@pytest.fixture(scope="session")
def mm_tree(upstream: Path) -> MMTrees:
    return MMTrees(upstream)


class MMTrees:
    """Finds a MindSpeed-MM version's tree by registry version id ("26.0.0", "master", ...)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def version_dir(self, version: str) -> Path | None:
        base = self.root / "MindSpeed-MM"
        if version == "master":
            found = sorted(base.glob("master-*"))
            return found[-1] if found else None
        path = base / f"v{version}"
        return path if path.is_dir() else None

    def mindspeed_dir(self, version: str) -> Path | None:
        path = self.root / "MindSpeed" / f"{version}_core_r0.12.1"
        return path if path.is_dir() else None

    def megatron_dir(self) -> Path:
        return self.root / "Megatron-LM" / "core_v0.12.1"
