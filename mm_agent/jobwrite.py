"""Writing a rendered job directory: atomically, and only where it was confined.

Everything happens relative to one descriptor of the job's parent directory, reached from the workspace
one component at a time without following symlinks (`paths.open_dir`): the temp directory is created
inside that parent, files are created with O_EXCL|O_NOFOLLOW, and the renames that publish the job or
move the old one to its backup name are done by descriptor too. So a parent swapped for a symlink after
the path was checked cannot redirect any write outside the workspace, and a killed render leaves only a
hidden `.NAME.tmp-*` folder, never a half-written job under the real name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from mm_agent.errors import MMAgentError, os_error
from mm_agent.paths import open_dir

_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
Status = Literal["written", "unchanged", "replaced"]


def _subdir(fd: int, name: str, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=fd)
    return os.open(name, _NOFOLLOW_DIR, dir_fd=fd)


def _open_parent(fd: int, rel: str, create: bool) -> tuple[int, str]:
    """(descriptor of the directory holding `rel`, its last component), walking without symlinks."""
    *dirs, name = rel.split("/")
    cur = os.dup(fd)
    try:
        for part in dirs:
            nxt = _subdir(cur, part, create)
            os.close(cur)
            cur = nxt
    except BaseException:
        os.close(cur)
        raise
    return cur, name


def _write_tree(fd: int, files: dict[str, str]) -> None:
    for rel, text in files.items():
        parent, name = _open_parent(fd, rel, create=True)
        try:
            mode = 0o755 if rel.endswith(".sh") else 0o644
            out = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent
            )
            with os.fdopen(out, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
            os.chmod(name, mode, dir_fd=parent)  # the umask must not strip the scripts' execute bit
        finally:
            os.close(parent)


def _read_tree_file(fd: int, rel: str) -> str | None:
    """Text of a regular file below `fd` (no symlink followed), None when it is not one."""
    try:
        parent, name = _open_parent(fd, rel, create=False)
    except OSError:
        return None
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return None
        raw = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        with os.fdopen(raw, "rb") as fh:
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(parent)


def _all_files(fd: int, rel: str = "") -> set[str]:
    found: set[str] = set()
    with os.scandir(fd) as it:
        for entry in it:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, _NOFOLLOW_DIR, dir_fd=fd)
                try:
                    found |= _all_files(sub, name)
                finally:
                    os.close(sub)
            elif entry.is_file(follow_symlinks=False):
                found.add(name)
    return found


def _same_tree(fd: int, files: dict[str, str], old_files: set[str] | None) -> bool:
    """The job in the directory is this one: same job files, same text (outputs written into it don't count)."""
    if old_files is None:
        old_files = _all_files(fd)
    return old_files == set(files) and all(_read_tree_file(fd, rel) == text for rel, text in files.items())


def _carry_outputs(old_fd: int, new_fd: int, job_files: set[str], rel: str = "") -> list[str]:
    """Move what is not a job file (of the old or the new render) from the replaced job into the new one,
    so re-rendering keeps extracted features, samples and logs; returns the moved paths."""
    moved: list[str] = []
    with os.scandir(old_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        if name in job_files:
            continue
        holds_job_files = any(f.startswith(name + "/") for f in job_files)
        if holds_job_files and entry.is_dir(follow_symlinks=False):
            old_sub = os.open(entry.name, _NOFOLLOW_DIR, dir_fd=old_fd)
            try:
                new_sub = _subdir(new_fd, entry.name, create=True)
                try:
                    moved += _carry_outputs(old_sub, new_sub, job_files, name)
                finally:
                    os.close(new_sub)
            finally:
                os.close(old_sub)
        elif not holds_job_files:
            os.rename(entry.name, entry.name, src_dir_fd=old_fd, dst_dir_fd=new_fd)
            moved.append(name)
    return moved


def _is_empty(fd: int) -> bool:
    with os.scandir(fd) as it:
        return next(it, None) is None


def write_job(
    target: Path,
    files: dict[str, str],
    *,
    force: bool,
    root: Path | None,
    job_files_of: Callable[[Path], set[str] | None],
) -> tuple[Status, str | None, list[str]]:
    """Publish `files` as the directory `target`; an existing different job is only replaced with `force`.

    `target` must be resolved and, with `root`, confined. `job_files_of(target)` names the files the job
    already in `target` renders to (None when there is no readable job); a non-empty directory without a
    job is refused whatever `force` says. The replaced job's files go to a backup directory beside it; what
    the job wrote into its directory (features, samples, logs) moves into the new one. Returns (status,
    backup dir, moved outputs).
    """
    name = target.name
    try:
        parent = open_dir(target.parent, root, field="out_dir", create=True)
    except OSError as exc:
        raise os_error(exc, file=str(target.parent), field="out_dir") from None
    try:
        return _publish(parent, target, name, files, force, job_files_of)
    except OSError as exc:
        raise os_error(exc, file=str(target), field="out_dir") from None
    finally:
        os.close(parent)


def _publish(
    parent: int,
    target: Path,
    name: str,
    files: dict[str, str],
    force: bool,
    job_files_of: Callable[[Path], set[str] | None],
) -> tuple[Status, str | None, list[str]]:
    existing: int | None = None
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise MMAgentError(
                "output path exists and is not a directory"
                + (" (a symlink)" if stat.S_ISLNK(st.st_mode) else ""),
                file=str(target),
                field="out_dir",
                fix="choose another --out",
            )
        existing = os.open(name, _NOFOLLOW_DIR, dir_fd=parent)
    old_files: set[str] | None = None
    try:
        if existing is not None and not _is_empty(existing):
            old_files = job_files_of(target)
            if old_files is None:
                raise MMAgentError(
                    "output directory holds files but no rendered job (no readable job.yaml)",
                    file=str(target),
                    field="out_dir",
                    fix="choose a new or empty --out; mm-agent only replaces a directory it rendered",
                )
            if _same_tree(existing, files, old_files):
                return "unchanged", None, []
            if not force:
                raise MMAgentError(
                    "output directory already holds a different job",
                    file=str(target),
                    field="out_dir",
                    fix="choose a new --out, or pass --force to replace it (the old job files are kept as a "
                    "backup; features and other outputs move to the new job)",
                )
    finally:
        if existing is not None:
            os.close(existing)
    tmp = f".{name}.tmp-{secrets.token_hex(4)}"
    os.mkdir(tmp, 0o777, dir_fd=parent)
    tmp_fd = os.open(tmp, _NOFOLLOW_DIR, dir_fd=parent)
    try:
        _write_tree(tmp_fd, files)
    except BaseException:
        os.close(tmp_fd)
        _remove_tree(parent, tmp)
        raise
    try:
        if st is None:
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            return "written", None, []
        if old_files is None:  # an empty directory: take its place
            os.rmdir(name, dir_fd=parent)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            return "written", None, []
        backup = _free_name(parent, f"{name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(name, backup, src_dir_fd=parent, dst_dir_fd=parent)
        moved: list[str] = []
        try:
            old_fd = os.open(backup, _NOFOLLOW_DIR, dir_fd=parent)
            try:
                moved = _carry_outputs(old_fd, tmp_fd, old_files | set(files))
            finally:
                os.close(old_fd)
        finally:
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)  # never deleted once outputs moved in
        return "replaced", str(target.parent / backup), moved
    finally:
        os.close(tmp_fd)


def _free_name(parent: int, name: str) -> str:
    """`name`, or `name-2`, `name-3`, ... : the first that does not exist in `parent`."""
    candidate, n = name, 1
    while True:
        try:
            os.stat(candidate, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return candidate
        n += 1
        candidate = f"{name}-{n}"


def _remove_tree(parent: int, name: str) -> None:
    """Remove a temp tree this module created (by descriptor; symlinks are unlinked, never followed)."""
    with contextlib.suppress(OSError):
        fd = os.open(name, _NOFOLLOW_DIR, dir_fd=parent)
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(fd, entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
