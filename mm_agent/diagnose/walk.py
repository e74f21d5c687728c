"""Directory walks for a diagnosis: iterative, depth-capped, and re-checked against the workspace.

Python 3.11's `os.walk` recurses, so a tree a thousand levels deep raised RecursionError (over MCP an
opaque "Error executing tool"). This walk keeps its own stack and does not enter directories deeper than
`MAX_DEPTH` levels; those are listed in `skipped` with how to read them anyway. Each directory is opened
first and its real path (`/proc/self/fd`) checked against the roots before it is listed through that
descriptor, so a directory swapped for a symlink mid-walk lists nothing outside. Symlinked directories are
not followed (no loops); a symlink to a file counts when it resolves inside the roots. Symlink loops,
broken links, FIFOs, sockets and devices are skipped with the reason, never opened. A label is what the
report shows, so a name that is not UTF-8 is escaped in it (`names.shown`); the path keeps the real name.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from mm_agent import cancel
from mm_agent.names import shown
from mm_agent.paths import opened_path, owning_root

MAX_DEPTH = 64  # directory levels below a walked path (torchrun and plog trees need about 4)
MAX_DEEP_LISTED = 20  # directories named one by one in `skipped` for being too deep; the rest are counted

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _kind(mode: int) -> str:
    """What a file that is neither a regular file nor a directory is, for the skip reason."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def walk(top: Path, shown: str, root: Path | None, skipped: list[str]) -> Iterator[tuple[Path, str]]:
    """(path to open, label) of the regular files under `top`, in name order, a directory's own files
    before its subdirectories (as `os.walk` top-down gives them); hidden entries are left out."""
    stack: list[tuple[Path, str, int]] = [(top, shown, 0)]
    too_deep: list[str] = []
    while stack:
        cancel.check()  # an abandoned call stops walking here
        directory, label, depth = stack.pop()
        listing = _list(directory, label, root, skipped)
        if listing is None:
            continue
        files, dirs = listing
        yield from files
        if depth >= MAX_DEPTH:
            too_deep += [sub_label for _, sub_label in dirs]
            continue
        stack.extend((sub, sub_label, depth + 1) for sub, sub_label in reversed(dirs))
    for sub_label in too_deep[:MAX_DEEP_LISTED]:
        skipped.append(
            f"{sub_label} (directory deeper than {MAX_DEPTH} levels, not walked: pass it as a path of its own)"
        )
    if len(too_deep) > MAX_DEEP_LISTED:
        skipped.append(f"{len(too_deep) - MAX_DEEP_LISTED} more directories deeper than {MAX_DEPTH} levels")


def _list(
    directory: Path, label: str, root: Path | None, skipped: list[str]
) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]] | None:
    """(files, subdirectories) of one directory, listed through a descriptor whose real path was checked;
    None (and the reason in `skipped`) when it cannot be listed or now lies outside the roots."""
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        skipped.append(f"{label} (directory not readable: {exc.strerror or exc})")
        return None
    try:
        real = _real(fd, directory)
        if root is not None and owning_root(real, root) is None:
            skipped.append(
                f"{label} (now leads outside the workspace: a directory was replaced by a symlink)"
            )
            return None
        with os.scandir(fd) as entries:
            names = sorted(e.name for e in entries if not e.name.startswith("."))
        files: list[tuple[Path, str]] = []
        dirs: list[tuple[Path, str]] = []
        for name in names:
            path, sub_label = real / name, os.path.join(label, shown(name))  # a label is text: escaped
            kind = _entry(fd, name, path, root)
            if kind == "dir":
                dirs.append((path, sub_label))
            elif kind == "file":
                files.append((path, sub_label))
            elif kind:
                skipped.append(f"{sub_label} ({kind})")
        return files, dirs
    except OSError as exc:
        skipped.append(f"{label} (directory not readable: {exc.strerror or exc})")
        return None
    finally:
        os.close(fd)


def _real(fd: int, directory: Path) -> Path:
    """Where the descriptor really points (the path itself where /proc is not mounted)."""
    try:
        return opened_path(fd)
    except OSError:
        return directory


def _entry(dir_fd: int, name: str, path: Path, root: Path | None) -> str:
    """What an entry is: "dir" (a real directory), "file" (a regular file or a link to one inside the roots),
    "" (a link to a directory: not followed), or why it is skipped."""
    try:
        own = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return f"not readable: {exc.strerror or exc}"
    if stat.S_ISDIR(own.st_mode):
        return "dir"
    if stat.S_ISREG(own.st_mode):
        return "file"
    if not stat.S_ISLNK(own.st_mode):
        return f"{_kind(own.st_mode)}; only regular files are read"
    try:
        target = os.stat(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop: remove or repoint the link"
        return f"broken symlink: {exc.strerror or exc}"
    if stat.S_ISDIR(target.st_mode):
        return ""
    if not stat.S_ISREG(target.st_mode):
        return f"links to {_kind(target.st_mode)}; only regular files are read"
    if root is not None and owning_root(Path(os.path.realpath(path)), root) is None:
        return "links outside the workspace"
    return "file"
