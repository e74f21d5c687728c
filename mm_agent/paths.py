"""Confinement: every path an MCP tool touches must stay inside the workspace (or an allowed root), and
stay there between the check and the use.

`confine` resolves a path (symlinks followed; for paths that do not exist yet, the nearest existing parent)
and checks containment component by component, never by string prefix. A check alone is not enough: a
parent swapped for a symlink between the check and the open would still escape. So files are opened by
`open_file`, which refuses FIFOs, devices and sockets before opening (a FIFO would block the call forever),
opens without blocking, and re-checks what was opened (`fstat`, `/proc/self/fd`) against the roots; and
directories are written through `open_dir`, which walks from the root one component at a time with
`O_NOFOLLOW`, so nothing is ever created through a symlink.

The workspace is the `root` argument the core functions take (None = the CLI, which trusts its operator).
Roots the server operator allows besides it (`mm-agent serve --allow-path DIR`) are set for the duration
of a tool call with `allowed_roots(...)`; they widen every check here in the same way.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO

from mm_agent.errors import MMAgentError, os_error

_ALLOWED: ContextVar[tuple[Path, ...]] = ContextVar("mm_agent_allowed_roots", default=())
_PROC_FD = Path("/proc/self/fd")


@contextlib.contextmanager
def allowed_roots(roots: Iterable[Path]) -> Iterator[None]:
    """Within the block, paths may also lie under `roots` (resolved here), as well as under the workspace."""
    token = _ALLOWED.set(tuple(Path(r).resolve() for r in roots))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


# Within `one_resolution()`, each root is resolved once (a validation asks about dozens of paths against the
# same workspace); outside it, on every call.
_RESOLVED_ROOTS: ContextVar[dict[Path, Path] | None] = ContextVar("mm_agent_resolved_roots", default=None)


@contextlib.contextmanager
def one_resolution() -> Iterator[None]:
    """Within the block (one call's work), `roots_of` resolves each workspace root once."""
    token = _RESOLVED_ROOTS.set({})
    try:
        yield
    finally:
        _RESOLVED_ROOTS.reset(token)


def roots_of(root: Path) -> tuple[Path, ...]:
    """The workspace followed by the allowed roots in force."""
    known = _RESOLVED_ROOTS.get()
    if known is None:
        return (root.resolve(), *_ALLOWED.get())
    if root not in known:
        known[root] = root.resolve()
    return (known[root], *_ALLOWED.get())


def owning_root(path: Path, root: Path) -> Path | None:
    """The root (workspace first) that contains the already-resolved `path`, or None."""
    for base in roots_of(root):
        if path == base or path.is_relative_to(base):
            return base
    return None


def inside(path: Path, root: Path) -> bool:
    """True when `path`, symlinks followed, lies in the workspace or an allowed root."""
    try:
        return owning_root(resolve(path, "path"), root) is not None
    except (MMAgentError, ValueError):  # ValueError: a NUL byte, which no real path holds
        return False


ALLOW_HOW = "the server operator adds one with `mm-agent serve --allow-path DIR`, repeatable"


def where(root: Path) -> str:
    """How to name the permitted area in a refusal: every root that IS allowed, and how to add one."""
    allowed = _ALLOWED.get()
    if not allowed:
        return f"the workspace {root.resolve()} (the only allowed root; {ALLOW_HOW})"
    return (
        f"the workspace {root.resolve()} and the allowed paths {', '.join(map(str, allowed))} ({ALLOW_HOW})"
    )


def check_text(value: str, field: str) -> None:
    """Refuse NUL and other control characters: a path with a newline is never what was meant, and it is
    the one character that could end a line of a rendered script."""
    bad = next((ch for ch in value if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ch in "\u2028\u2029"), None)
    if bad is not None:
        name = "a NUL byte" if bad == "\x00" else f"the control character {bad!r}"
        raise MMAgentError(
            f"{value[:80]!r} contains {name}", field=field, fix="pass a plain path on one line"
        )


def resolve(path: Path, field: str) -> Path:
    """`path.resolve()` with symlink loops and over-long paths as errors that name the fix."""
    try:
        return path.resolve()
    except RuntimeError as exc:  # Python 3.11 reports a symlink loop this way
        raise MMAgentError(
            f"{path}: symlink loop ({exc})",
            field=field,
            fix="remove or repoint the looping symlink, or pass the real path",
        ) from None
    except OSError as exc:
        raise os_error(exc, file=str(path), field=field) from None


def confine(user_path: str, root: Path, field: str = "path") -> Path:
    """Resolve `user_path` (relative to `root`, or absolute) and require it to stay inside the workspace
    `root` or an allowed root."""
    check_text(user_path, field)
    root = root.resolve()
    candidate = Path(user_path).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = resolve(candidate, field)
    if owning_root(resolved, root) is None:
        raise MMAgentError(
            f"path {user_path!r} resolves outside {where(root)}",
            field=field,
            fix="use a path under one of the allowed roots, or ask the server operator to allow the "
            "directory that holds it",
        )
    return resolved


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for the refusal; None for regular files."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def _refuse_kind(path: Path, mode: int, field: str) -> None:
    kind = _kind(mode)
    if kind is not None:
        raise MMAgentError(
            f"{path} is {kind}; only regular files are read",
            file=str(path),
            field=field,
            fix="pass a regular file (reading a pipe or device could block or never end)",
        )


def require_regular(path: Path, field: str = "path") -> None:
    """Refuse FIFOs, sockets and devices before anything opens them (`stat`, symlinks followed)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise os_error(exc, file=str(path), field=field) from None
    _refuse_kind(path, mode, field)


@functools.cache
def _proc_fd() -> bool:
    """Whether /proc/self/fd tells an open descriptor's path (Linux; asked once, not at every open)."""
    return _PROC_FD.is_dir()


def opened_path(fd: int) -> Path:
    """The real path of an open descriptor (Linux `/proc/self/fd`)."""
    return Path(os.readlink(_PROC_FD / str(fd)))


def open_file(path: Path, root: Path | None = None, field: str = "path") -> BinaryIO:
    """Open a regular file for reading without blocking on FIFOs or devices; with `root`, what was opened
    must still lie inside the roots (a parent swapped for a symlink after `confine` is caught here)."""
    require_regular(path, field)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise os_error(exc, file=str(path), field=field) from None
    try:
        _refuse_kind(path, os.fstat(fd).st_mode, field)
        if root is not None and _proc_fd():
            real = opened_path(fd)
            if owning_root(real, root) is None:
                raise MMAgentError(
                    f"{path} now leads to {real}, outside {where(root)} (a parent was replaced by a "
                    "symlink after the path was checked)",
                    file=str(path),
                    field=field,
                    fix="remove the symlink, or pass the real path inside the workspace",
                )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_upto(fh: BinaryIO, limit: int) -> bytes:
    """At most `limit + 1` bytes of an open file (more than `limit`: the file is over it), asking only for what
    fstat says is there: `fh.read(limit + 1)` allocates the whole cap for every file, 64 MiB for a config."""
    size = os.fstat(fh.fileno()).st_size
    raw = fh.read(min(size, limit) + 1)
    if size < len(raw) <= limit:  # it grew after fstat: on to the cap
        raw += fh.read(limit + 1 - len(raw))
    return raw


def read_file(path: Path, root: Path | None = None, field: str = "path", limit: int | None = None) -> bytes:
    """The bytes of a regular file (see `open_file`); over `limit` bytes is an error naming the size."""
    with open_file(path, root, field) as fh:
        if limit is not None:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise MMAgentError(
                    f"{path} is {size} bytes, over the {limit}-byte limit",
                    file=str(path),
                    field=field,
                    fix="pass a smaller file",
                )
        try:
            return fh.read()
        except OSError as exc:
            raise os_error(exc, file=str(path), field=field) from None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(path: Path, root: Path | None, field: str = "path", create: bool = False) -> int:
    """A descriptor of directory `path` (resolved), reached from its root one component at a time with
    O_NOFOLLOW, so a component replaced by a symlink since `confine` fails instead of leading outside.
    Missing components are created when `create` (mkdir -p). Without `root`, the path is opened directly.
    The caller closes the descriptor."""
    if root is None:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    base = owning_root(path, root)
    if base is None:
        raise MMAgentError(
            f"{path} is outside {where(root)}",
            field=field,
            fix="use a path under one of the allowed roots, or ask the server operator to allow the "
            "directory that holds it",
        )
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.relative_to(base).parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise MMAgentError(
                f"{path} changed while in use: a part of it is now a symlink or not a directory",
                file=str(path),
                field=field,
                fix="replace the symlink by a real directory inside the workspace, then retry",
            ) from None
        raise os_error(exc, file=str(path), field=field) from None
    return fd
