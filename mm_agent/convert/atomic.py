"""All-or-nothing output: write into a temp dir, rename into place when complete, marker file last.

A run killed at any point must not leave a target that looks valid (Megatron would load a half-written
checkpoint, or `from_pretrained` a half-written export). Two modes:
- the target does not exist (or is an empty dir): stage in a hidden sibling dir and rename it onto the
  target in one step;
- the target exists (the Wan in-place form writes `release/` beside the diffusers files): stage in a hidden
  dir inside it, remove the old marker first, rename each entry into place, then the marker files last
  (`mm_agent_manifest.json`, then `latest_checkpointed_iteration.txt`). Source files are never opened for
  writing and never renamed.
Everything staged is flushed to disk before it is renamed into place, so this holds after a power cut too.
Temp dirs carry the writer's pid; the next run removes those whose process is gone.

A disk that fills up while staging is reported as the full disk it is (`errors.os_error`, ENOSPC, with the
fix), naming the target: the OS's ENOSPC/EDQUOT, and torch's stream writer, which says only "unexpected
pos N vs M" (or "PytorchStreamWriter failed writing") when a write fails, whenever the target's filesystem
is then (nearly) full, checked before the staged files are removed.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import time
from pathlib import Path
from types import TracebackType

import psutil

from mm_agent.errors import MMAgentError, os_error

TEMP_TAG = ".mm-agent-tmp-"
SCRATCH = ".scratch"
# Test-only: seconds to sleep after each output file, so tests can kill a run mid-way. Unset in real use.
SLOW_ENV = "MM_AGENT_CONVERT_TEST_DELAY"
# torch's PytorchStreamWriter words for a failed write (it does not keep the errno)
_WRITER_FAILED = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
FULL_BELOW_BYTES = 64 * 1024 * 1024  # free space under which a failed write is taken for a full disk


def disk_full(exc: BaseException, where: Path) -> bool:
    """Whether `exc`, raised while writing under `where`, means its filesystem is full."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not (isinstance(exc, RuntimeError) and any(w in str(exc) for w in _WRITER_FAILED)):
        return False
    try:
        return shutil.disk_usage(where).free < FULL_BELOW_BYTES
    except OSError:
        return False


def pause_for_tests() -> None:
    delay = os.environ.get(SLOW_ENV)
    if delay:
        time.sleep(float(delay))


def _temp_dirs(target: Path) -> list[Path]:
    inside = list(target.glob(f"{TEMP_TAG}*")) if target.is_dir() else []
    beside = list(target.parent.glob(f".{target.name}{TEMP_TAG}*")) if target.parent.is_dir() else []
    return [p for p in inside + beside if p.is_dir()]


def _owner_pid(path: Path) -> int | None:
    pid = path.name.rsplit(TEMP_TAG, 1)[-1].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def clean_stale(target: Path) -> None:
    """Remove temp dirs of dead runs; refuse while another live run is writing the same target."""
    for path in _temp_dirs(target):
        pid = _owner_pid(path)
        if pid is not None and pid != os.getpid() and psutil.pid_exists(pid):
            raise MMAgentError(
                f"another conversion (pid {pid}) is writing {target}",
                field="target",
                fix=f"wait for it to finish, or stop it; its temp dir is {path}",
            )
        shutil.rmtree(path, ignore_errors=True)


class Staging:
    """`with Staging(target) as st:` write under `st.dir`, then `st.commit(last=[...])`.

    Leaving the block without commit (an error) deletes the temp dir; a kill leaves it for `clean_stale`.
    """

    def __init__(self, target: Path):
        self.target = target
        self.tag = f"{TEMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"
        self.in_place = False
        self.dir = target.parent / f".{target.name}{self.tag}"
        self.committed = False

    @property
    def scratch_dir(self) -> Path:
        """For `tensors.Scratch`: inside the temp dir, never renamed into the target."""
        return self.dir / SCRATCH

    def __enter__(self) -> Staging:
        clean_stale(self.target)
        self.in_place = self.target.is_dir() and any(self.target.iterdir())
        if self.in_place:
            self.dir = self.target / self.tag
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.committed:
            full = exc is not None and disk_full(exc, self.dir if self.dir.exists() else self.target.parent)
            shutil.rmtree(self.dir, ignore_errors=True)
            if full:
                assert exc is not None
                raise os_error(
                    OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.target)), field="target"
                ) from exc

    def commit(self, last: list[str]) -> None:
        """Move the staged files into the target; `last` (top-level names) go last, in order."""
        shutil.rmtree(self.scratch_dir, ignore_errors=True)
        _fsync_tree(self.dir)
        if not self.in_place:
            if self.target.is_dir():
                self.target.rmdir()  # empty (checked in __init__)
            os.rename(self.dir, self.target)
            _fsync(self.target.parent)
            self.committed = True
            return
        for name in last:  # the target must stop looking valid before anything in it changes
            (self.target / name).unlink(missing_ok=True)
        staged = sorted(p.name for p in self.dir.iterdir() if p.name not in last)
        for name in [*staged, *(n for n in last if (self.dir / n).exists())]:
            _replace(self.dir / name, self.target / name, self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        _fsync(self.target)
        self.committed = True


def _fsync_tree(root: Path) -> None:
    """Flush every file and folder under `root` to disk. Run before the rename that publishes them: the
    rename only orders the names, and after a power cut (ext4 allocates lazily) a checkpoint whose tracker
    made it to disk could otherwise hold empty or partial rank files."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath, name))
        _fsync(Path(dirpath))


def _fsync(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(src: Path, dst: Path, trash_dir: Path) -> None:
    """Atomic per entry: a dir that exists is moved aside first (rename cannot replace a non-empty dir)."""
    if dst.is_dir() and not dst.is_symlink():
        old = trash_dir / f".old-{dst.name}"
        os.rename(dst, old)
        os.rename(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)
