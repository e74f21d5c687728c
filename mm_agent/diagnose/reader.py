"""Inputs of a diagnosis: files, directory trees, stdin or text, read as bounded blocks of bytes.

Directories are walked in name order (training logs, torchrun `--log-dir` trees, CANN plog trees such as
`~/ascend/log/debug/plog/` with `device-<id>/`; see `walk.py`), skipping hidden entries and, in walks
only, binary files (a NUL byte in the first 8 KiB, as grep decides): a file named explicitly is always
read. gzip is recognised by its magic bytes (rotated `*.log.1.gz` included) and decompressed as a stream,
at most `MAX_DECOMPRESSED` bytes of it (a small gzip can expand to gigabytes).

Only regular files are opened: a FIFO would block the call forever, a device never end. With a workspace
`root`, every file is opened by `paths.open_file`, which checks what was really opened against the roots,
so a parent swapped for a symlink after the path was checked cannot leak a file from outside.
"""

from __future__ import annotations

import errno
import gzip
import io
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from mm_agent import cancel, names
from mm_agent.diagnose.ranks import rank_from_path
from mm_agent.diagnose.scan import FileScan, ScanContext
from mm_agent.diagnose.walk import walk
from mm_agent.errors import MMAgentError, os_error
from mm_agent.paths import confine, open_file, require_regular

BLOCK = 8 * 1024 * 1024
BINARY_SNIFF = 8192
MAX_DECOMPRESSED = 512 * 1024 * 1024  # bytes read out of one compressed file
MIB = 1024 * 1024
STDIN = "-"


@dataclass(frozen=True)
class Source:
    """One input: a file on disk, stdin, or caller-supplied text; `walked` = found in a directory walk;
    `root` = the workspace its file must stay in when opened (None: the CLI, or mm-agent's own run log)."""

    name: str
    path: Path | None = None
    text: bytes | None = None
    walked: bool = False
    root: Path | None = None

    def open(self) -> tuple[BinaryIO, bool]:
        """The input's decompressed bytes, and whether they are decompressed (gzip detected by magic)."""
        if self.text is not None:
            return io.BytesIO(self.text), False
        raw: io.BufferedReader = (
            sys.stdin.buffer  # type: ignore[assignment]
            if self.path is None
            else open_file(self.path, self.root, "paths")
        )
        try:
            magic = raw.peek(2)[:2]
        except OSError as exc:
            raw.close()
            raise os_error(exc, file=self.name, field="paths") from None
        if magic == b"\x1f\x8b":
            return gzip.GzipFile(fileobj=raw), True  # type: ignore[return-value]
        return raw, False

    def year(self) -> int:
        """Year assumed for year-less (glog) timestamps until a log line states one."""
        try:
            if self.path is not None:
                return datetime.fromtimestamp(self.path.stat().st_mtime).year
        except OSError:
            pass
        return datetime.now().year


def _is_dir(path: Path, raw: str, root: Path | None) -> bool:
    """Whether a requested path is a directory; a missing path, a symlink loop and the like are errors."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise MMAgentError(
                f"{raw}: no such file or directory",
                file=raw,
                field="paths",
                fix="pass existing log files or directories" + (" inside the workspace" if root else ""),
            ) from None
        raise os_error(exc, file=raw, field="paths") from None


def collect(paths: list[str], root: Path | None) -> tuple[list[Source], list[str]]:
    """Expand the requested paths into sources (files in walk order); a missing path, or one that is not
    a regular file or directory (FIFO, socket, device), is an error."""
    sources: list[Source] = []
    skipped: list[str] = []
    for raw in paths:
        if raw == STDIN and root is None:
            sources.append(Source(name="<stdin>"))
            continue
        path = confine(raw, root, "paths") if root is not None else Path(raw).expanduser()
        shown = names.shown(
            str(path.relative_to(root)) if root is not None and path.is_relative_to(root) else raw
        )
        if _is_dir(path, raw, root):
            found = walk(path, shown, root, skipped)
            sources.extend(Source(name=label, path=p, walked=True, root=root) for p, label in found)
        else:
            require_regular(path, "paths")
            sources.append(Source(name=shown, path=path, root=root))
    return sources, skipped


def _blocks(stream: BinaryIO, damage: list[str], limit: int | None) -> Iterator[bytes]:
    """Blocks of about BLOCK bytes, `limit` bytes in all at most; on a read error (damaged gzip, I/O) what
    came before is still given."""
    parts: list[bytes] = []
    size = 0
    left = limit
    while True:
        want = BLOCK - size if left is None else min(BLOCK - size, left)
        try:
            data = stream.read1(want) if want > 0 else b""  # type: ignore[attr-defined]
        except (OSError, EOFError, zlib.error) as exc:
            damage.append(str(exc) or type(exc).__name__)
            data = b""
        if left is not None:
            left -= len(data)
        if data:
            parts.append(data)
            size += len(data)
        if parts and (size >= BLOCK or not data):
            yield b"".join(parts)
            parts, size = [], 0
        if not data:
            return


def _more(stream: BinaryIO) -> bool:
    """Whether a stream stopped at the cap had anything left (a damaged rest counts as nothing)."""
    try:
        return stream.read1(1) != b""  # type: ignore[attr-defined]
    except (OSError, EOFError, zlib.error):
        return False


def read_source(ctx: ScanContext, source: Source, index: int) -> None:
    """Scan one input to its end, block by block; damage (bad gzip, I/O errors) and the decompression cap
    become notes. A named file that cannot be opened is an error, a walked one is skipped with the reason."""
    try:
        stream, compressed = source.open()
    except MMAgentError as exc:
        if not source.walked:
            raise
        ctx.skipped.append(f"{source.name} ({exc.message})")
        return
    scan = FileScan(ctx, source.name, index, rank_from_path(source.name), source.year())
    damage: list[str] = []
    limit = MAX_DECOMPRESSED if compressed else None
    read = 0
    with stream:
        for n, block in enumerate(_blocks(stream, damage, limit)):
            if n == 0 and source.walked and b"\x00" in block[:BINARY_SNIFF]:
                ctx.skipped.append(f"{source.name} (binary)")
                return
            cancel.check()  # an abandoned call stops reading here
            read += len(block)
            scan.feed(block)
        capped = limit is not None and read >= limit and _more(stream)
    ctx.files.append(source.name)
    if damage:
        ctx.note(f"{source.name}: stopped reading after {scan.lines} lines: {damage[0]}")
    if capped:
        ctx.note(
            f"{source.name}: stopped after {read // MIB} MiB decompressed (the cap on one compressed file); "
            "the rest was not read: diagnose the uncompressed log, or the part of it that matters"
        )
    scan.finish()
