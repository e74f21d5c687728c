"""What the bundled runtime (`runtime/`, `python -m runtime.*`) needs, read from mm-agent's own package
metadata: `Requires-Python` and the `runtime` extra's `Requires-Dist` lines, i.e. pyproject.toml as installed.
Nothing here is hard-coded; the checks in `checks_bundled.py` compare the training interpreter against it.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

DIST = "mm-agent"
EXTRA = "runtime"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
INSTALL_HINT = "pip install -c constraints.txt -e '.[runtime]' (in the mm-agent checkout)"


def pip_install(python: str, specs: list[str]) -> str:
    """The pip line that installs `specs` into the interpreter `python`, with the checkout's constraints."""
    words = " ".join(shlex.quote(s) for s in specs)
    return f"`{shlex.quote(python)} -m pip install -c constraints.txt {words}` (in the mm-agent checkout)"


@dataclass(frozen=True)
class RuntimeNeeds:
    requires_python: SpecifierSet | None
    requirements: tuple[Requirement, ...]  # the `runtime` extra, markers already applied
    source: str  # where these came from, for the evidence

    def get(self, name: str) -> Requirement | None:
        key = canonicalize_name(name)
        return next((r for r in self.requirements if canonicalize_name(r.name) == key), None)


def _extra_only(lines: list[str]) -> tuple[Requirement, ...]:
    reqs = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and req.marker.evaluate({"extra": EXTRA}):
            reqs.append(req)
    return tuple(reqs)


def _from_pyproject() -> RuntimeNeeds | None:
    if sys.version_info < (3, 11) or not PYPROJECT.is_file():
        return None
    import tomllib

    project: dict[str, Any] = tomllib.loads(PYPROJECT.read_text(encoding="utf-8")).get("project", {})
    lines = [f'{s}; extra == "{EXTRA}"' for s in project.get("optional-dependencies", {}).get(EXTRA, [])]
    python = project.get("requires-python")
    return RuntimeNeeds(SpecifierSet(python) if python else None, _extra_only(lines), str(PYPROJECT))


@functools.cache
def runtime_needs() -> RuntimeNeeds:
    """The installed mm-agent's metadata; a source checkout's pyproject.toml when mm-agent is not installed."""
    try:
        meta = md.metadata(DIST)
    except md.PackageNotFoundError:
        found = _from_pyproject()
        return found or RuntimeNeeds(None, (), "unknown (mm-agent is not installed and no pyproject.toml)")
    python = (meta.get_all("Requires-Python") or [None])[0]
    version = (meta.get_all("Version") or ["?"])[0]
    return RuntimeNeeds(
        SpecifierSet(python) if python else None,
        _extra_only(md.requires(DIST) or []),
        f"{DIST} {version} package metadata (pyproject.toml [project.optional-dependencies] {EXTRA})",
    )


def requirement_names() -> list[str]:
    """Distribution names the interpreter probe must report for the bundled checks."""
    return [r.name for r in runtime_needs().requirements]
