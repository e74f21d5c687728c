"""Writing a dataset's outputs without touching the user's files.

Each output goes to a temporary name in its folder (opened from the root one component at a time, see
`paths.open_dir`) and is renamed over the final name only when complete, so a killed run leaves a dot-named
`.tmp` file, never a half-written index that looks valid. A file already at the final name is replaced only
when mm-agent wrote it (its SHA-256 is in the ledger in mm-agent's state directory) or it already holds the
same bytes; anything else is the user's, and the write is refused with the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path

from mm_agent.errors import MMAgentError, os_error
from mm_agent.paths import open_dir
from mm_agent.procs import state_dir

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _ledger_path() -> Path:
    return state_dir() / "datasets" / "written.json"


def _ledger() -> dict[str, str]:
    try:
        data = json.loads(_ledger_path().read_text(encoding="utf-8"))
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(path: Path, digest: str) -> None:
    ledger = _ledger()
    ledger[str(path)] = digest
    target = _ledger_path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(ledger, indent=0), encoding="utf-8")
    tmp.replace(target)


def _existing_digest(fd: int, name: str) -> str | None:
    """SHA-256 of the regular file `name` in folder `fd`; None when there is none; refused when it is a
    symlink or not a regular file."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise MMAgentError(
            f"{name} exists and is not a regular file (a symlink, folder or device)",
            file=name,
            fix="remove it or choose another output path (out)",
        )
    digest = hashlib.sha256()
    raw = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    with os.fdopen(raw, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _state(fd: int, path: Path, new_digest: str | None) -> str:
    have = _existing_digest(fd, path.name)
    if have is None:
        return "new"
    if new_digest is not None and have == new_digest:
        return "same"
    if _ledger().get(str(path)) == have:
        return "ours"
    raise MMAgentError(
        f"{path} exists and was not written by mm-agent",
        file=str(path),
        field="out",
        fix="choose another output path (out / --out), or move that file away; mm-agent never overwrites "
        "a file it did not write",
    )


def check_writable(path: Path, root: Path | None, new_digest: str | None = None) -> str:
    """'new', 'ours' (mm-agent wrote it: replaceable), 'same' (already these bytes); the user's file is an
    error naming the fix."""
    try:
        fd = open_dir(path.parent, root, "out", create=False)
    except (MMAgentError, OSError):
        return "new"  # the folder does not exist yet: created on write (confinement is checked then)
    try:
        return _state(fd, path, new_digest)
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under a temporary name in its folder and renamed into place by `commit`."""

    def __init__(self, path: Path, root: Path | None) -> None:
        self.path = path
        self.tmp = f".{path.name}.{os.getpid()}.tmp"
        try:
            self.fd = open_dir(path.parent, root, "out", create=True)
            raw = os.open(self.tmp, _CREATE, 0o644, dir_fd=self.fd)
        except OSError as exc:
            raise os_error(exc, file=str(path), field="out") from None
        self.fh = os.fdopen(raw, "wb")
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        self.fh.write(data)

    def commit(self) -> str:
        """Rename into place (unless the final file already holds these bytes); returns 'written' or
        'unchanged'."""
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        digest = self.digest.hexdigest()
        try:
            state = _state(self.fd, self.path, digest)
        except MMAgentError:
            self.abort()
            raise
        if state == "same":
            self.abort()
            _remember(self.path, digest)
            return "unchanged"
        os.replace(self.tmp, self.path.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        os.close(self.fd)
        _remember(self.path, digest)
        return "written"

    def abort(self) -> None:
        if not self.fh.closed:
            self.fh.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp, dir_fd=self.fd)
        os.close(self.fd)


def write_bytes(path: Path, data: bytes, root: Path | None) -> str:
    out = AtomicFile(path, root)
    try:
        out.write(data)
    except BaseException:
        out.abort()
        raise
    return out.commit()
