"""All-or-nothing files for the runtime: write a hidden temp file beside the target, rename it into place.

A run killed at any moment leaves either the old file or the new one, never a truncated file under the real
name; the hidden `.<name>.tmp-<pid>-<random>` leftovers are recognisable by `TEMP_MARK` and cleaned by their
owners. The random part keeps two threads of one process (or a pid reused) from sharing a temp file.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TEMP_MARK = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (the directory entry, not just the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, write: Callable[[BinaryIO], object], *, durable: bool = True) -> None:
    """Run `write(file_object)` on a hidden temp file beside `path`, fsync (if `durable`), rename onto `path`."""
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb") as handle:
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode("utf-8")), durable=durable)
