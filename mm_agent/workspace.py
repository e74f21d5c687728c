"""The workspace this process serves: the server's `--workspace`, else the CLI's current directory.

Its own module (no imports) so the server can set it at start-up without loading the registry that reads it
(`registry.user_models_dir`: the workspace's own models, written by `mm-agent new-model`).
"""

from __future__ import annotations

from pathlib import Path

_WORKSPACE: list[Path] = []


def set_workspace(path: Path | None) -> None:
    """The workspace whose own models (`.mm-agent/models/*.yaml`) the registry adds to the shipped ones: the
    server's workspace, the CLI's current directory (None, the default)."""
    _WORKSPACE[:] = [path.resolve()] if path is not None else []


def served_workspace() -> Path:
    return _WORKSPACE[0] if _WORKSPACE else Path.cwd()
