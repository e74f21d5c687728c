"""The one error type users see.

Library functions raise `MMAgentError` with what was wrong, where (file/field) and the fix. The CLI prints
it without a traceback and exits 2; the MCP server turns it into a `ToolError` the model can act on.
"""

from __future__ import annotations

import errno


class MMAgentError(Exception):
    def __init__(
        self, message: str, *, file: str | None = None, field: str | None = None, fix: str | None = None
    ):
        self.message = message
        self.file = file
        self.field = field
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        where = ": ".join(p for p in (self.file, self.field) if p)
        text = f"{where}: {self.message}" if where else self.message
        return f"{text}\nfix: {self.fix}" if self.fix else text


# errno -> (what happened, the fix). Everything else keeps the OS's own words and a generic fix.
_OS_FIXES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: (
        "no space left on the device",
        "free disk space (df -h shows which filesystem), then retry",
    ),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, or ask for a larger one"),
    errno.ELOOP: (
        "too many levels of symbolic links (a symlink loop, or a symlink where none is allowed)",
        "remove or repoint the symlink, or pass the real path",
    ),
    errno.ENAMETOOLONG: ("the path is too long", "use a shorter path (fewer or shorter folder names)"),
    errno.EACCES: ("permission denied", "make it readable/writable by this user, or choose another path"),
    errno.EPERM: ("operation not permitted", "check the owner and mode, or choose another path"),
    errno.EROFS: ("read-only filesystem", "write somewhere on a writable filesystem"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENOTDIR: ("a part of the path is not a directory", "check the path"),
    errno.EISDIR: ("is a directory", "pass a file, not a directory"),
    errno.EMFILE: ("too many open files", "raise the open-file limit (ulimit -n) or close other programs"),
    errno.EIO: ("input/output error", "check the disk or network filesystem (dmesg), then retry"),
}


def os_error(exc: OSError, *, file: str | None = None, field: str | None = None) -> MMAgentError:
    """An OSError as the user-facing error: what happened in plain words, the file, and the fix."""
    what, fix = _OS_FIXES.get(exc.errno or 0, (exc.strerror or str(exc), "check the path and retry"))
    return MMAgentError(
        what, file=file or (str(exc.filename) if exc.filename else None), field=field, fix=fix
    )
