"""The published tool list, remembered between server starts.

Building the sixteen tools means importing the whole core (registry, routing, rendering, validation, ...) and
letting the SDK derive each argument model and schema: ~0.3 s of a start that a host waits for before its
first `tools/list`. The list only changes when the code that shapes it changes, so the server writes it here
after computing it and, on the next start with the same code, answers `tools/list` from this file while the
tools load in the background (`server._Server`). The key covers everything the list is made from: every file
of mm_agent and of the SDK (size, modification time), pydantic's versions, the Python running them, and the
server options that change a tool's annotations. A file that is missing, unreadable, not a list of tools, or
that another user owns or can write is ignored (the start is simply a full one); once the tools have loaded,
the server checks the list it gave against theirs: a difference is logged, published as a tools list change,
written, and served from then on.

Where: `$MM_AGENT_CACHE_DIR`, else `$XDG_CACHE_HOME/mm-agent`, else `~/.cache/mm-agent` (none without a home);
one file per key, older keys' files removed when a new one is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp
import pydantic
import pydantic_core
from mcp.types import Tool

import mm_agent

log = logging.getLogger("mm_agent.toollist")
PREFIX = "tools-"


def cache_dir() -> Path | None:
    """`$MM_AGENT_CACHE_DIR`, else `$XDG_CACHE_HOME/mm-agent`, else `~/.cache/mm-agent`; None for a user with no
    home to name (no $HOME and no passwd entry, as in some containers): nothing is remembered then."""
    explicit = os.environ.get("MM_AGENT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mm-agent"
    except RuntimeError:  # (Path.home(): "Could not determine home directory")
        return None


def _tree(digest: Any, package: Path) -> None:
    """Every file under `package` (not bytecode caches): path, size and modification time, in a fixed order."""
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                digest.update(f"{os.path.relpath(path, package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


def fingerprint(options: Mapping[str, object]) -> str:
    """The key of the list that this code, these libraries and these server `options` publish."""
    digest = hashlib.sha256()
    digest.update(repr(sorted(options.items())).encode())
    digest.update(f"{sys.version}\0{pydantic.VERSION}\0{pydantic_core.__version__}\n".encode())
    for package in (mm_agent, mcp):  # (the SDK has no version attribute: its files say which one it is)
        _tree(digest, Path(package.__file__ or "").parent)
    return digest.hexdigest()[:32]


class ToolList:
    """The remembered list for one key: `tools` (None when there is none to trust), `save` after computing."""

    def __init__(self, key: str, folder: Path | None = None) -> None:
        self.key = key
        self.folder = folder or cache_dir()
        self.path = self.folder / f"{PREFIX}{key}.json" if self.folder is not None else None
        self.tools = self._read()

    def _read(self) -> list[Tool] | None:
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.getuid() or st.st_mode & 0o022:
                    # what tools/list says reaches the model: only a list this user wrote, that no one else can
                    log.warning("ignoring %s: not this user's, or writable by others", self.path)
                    return None
                data = json.loads(f.read().decode("utf-8"))
            if (
                not isinstance(data, dict)
                or data.get("key") != self.key
                or not isinstance(data.get("tools"), list)
            ):
                return None
            tools = [Tool.model_validate(t) for t in data["tools"]]
        except (OSError, ValueError) as exc:  # missing, unreadable, not JSON, not tools (ValidationError)
            if not isinstance(exc, FileNotFoundError):
                log.info("ignoring the remembered tool list %s: %s", self.path, exc)
            return None
        return tools or None

    @staticmethod
    def dump(tools: list[Tool]) -> list[dict[str, Any]]:
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]

    def save(self, tools: list[Tool]) -> None:
        """Remember `tools` for this key (atomically: a reader sees the old file or the whole new one); files of
        other keys go. A cache that cannot be written costs the next start its speed, nothing else."""
        if self.folder is None or self.path is None:
            return
        # (keys in the wire's order: the list is served as it was given)
        text = json.dumps({"key": self.key, "tools": self.dump(tools)}, ensure_ascii=False)
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=f".{PREFIX}", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            for old in self.folder.glob(f"{PREFIX}*.json"):
                if old != self.path:
                    with contextlib.suppress(OSError):
                        old.unlink()
        except OSError as exc:
            log.info("could not remember the tool list in %s: %s", self.folder, exc)
            return
        self.tools = tools
