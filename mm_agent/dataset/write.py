"""Writing a dataset's outputs without touching the user's files.

Each output goes to a temporary name in its folder (opened from the root one component at a time, see
`paths.open_dir`) and is renamed over the final name only when complete, so a killed run leaves a dot-named
`.tmp` file, never a half-written index that looks valid. A file already at the final name is replaced only
when mm-agent wrote it (its SHA-256 is in the ledger in mm-agent's state directory) or it already holds the
same bytes; anything else is the user's, and the write is refused with the fix.

Calls of one server are threads of one process, and several servers can share a state directory, so temp
names carry a random part (never the pid alone), and a file's check, its ledger entry and its rename happen
under one lock on the ledger (`flock`, which also excludes threads: each holds its own open file). Another
call then never finds a file mm-agent just wrote missing from the ledger, nor loses an entry to a concurrent
rewrite of the ledger.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
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


@contextlib.contextmanager
def _ledger_lock() -> Iterator[None]:
    """Held while a file is checked against the ledger and published: writers of one state directory (threads
    of a server, other processes) go one at a time through check, ledger update and rename."""
    lock = _ledger_path().with_name("written.json.lock")
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _remember(path: Path, digest: str) -> None:
    """Record `digest` as mm-agent's bytes at `path` (call under `_ledger_lock`)."""
    ledger = _ledger()
    ledger[str(path)] = digest
    target = _ledger_path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(ledger, indent=0))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
        with _ledger_lock():
            return _state(fd, path, new_digest)
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under a temporary name in its folder and renamed into place by `commit`."""

    def __init__(self, path: Path, root: Path | None) -> None:
        self.path = path
        try:
            self.fd = open_dir(path.parent, root, "out", create=True)
        except OSError as exc:
            raise os_error(exc, file=str(path), field="out") from None
        for attempt in range(8):  # a random name taken already (another call's) is only tried again
            self.tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                raw = os.open(self.tmp, _CREATE, 0o644, dir_fd=self.fd)
                break
            except FileExistsError:
                if attempt == 7:
                    os.close(self.fd)
                    raise MMAgentError(
                        f"no free temporary name beside {path}",
                        file=str(path),
                        field="out",
                        fix="remove the .*.tmp files left in that folder, then retry",
                    ) from None
            except OSError as exc:
                os.close(self.fd)
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
        with _ledger_lock():
            try:
                state = _state(self.fd, self.path, digest)
            except MMAgentError:
                self.abort()
                raise
            try:  # before the rename: a crash in between leaves no unrecorded file of ours
                _remember(self.path, digest)
            except OSError as exc:
                self.abort()
                raise os_error(exc, file=str(_ledger_path())) from None
            if state == "same":
                self.abort()
                return "unchanged"
            try:
                os.replace(self.tmp, self.path.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except OSError as exc:
                self.abort()
                raise os_error(exc, file=str(self.path), field="out") from None
        os.close(self.fd)
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
