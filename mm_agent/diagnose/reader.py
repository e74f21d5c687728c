"""Inputs of a diagnosis: files, directory trees, stdin or text, read as bounded blocks of bytes.

Directories are walked recursively in name order (training logs, torchrun `--log-dir` trees, CANN plog
trees such as `~/ascend/log/debug/plog/` with `device-<id>/`), skipping hidden entries and, in walks only,
binary files (a NUL byte in the first 8 KiB, as grep decides): a file named explicitly is always read.
gzip is recognised by its magic bytes (rotated `*.log.1.gz` included) and decompressed as a stream.
With a workspace `root` every path, and every file a walk reaches through a symlink, must stay inside it.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from mm_agent.diagnose.ranks import rank_from_path
from mm_agent.diagnose.scan import FileScan, ScanContext
from mm_agent.errors import MMAgentError
from mm_agent.paths import confine

BLOCK = 8 * 1024 * 1024
BINARY_SNIFF = 8192
STDIN = "-"


@dataclass(frozen=True)
class Source:
    """One input: a file on disk, stdin, or caller-supplied text; `walked` = found in a directory walk."""

    name: str
    path: Path | None = None
    text: bytes | None = None
    walked: bool = False

    def open(self) -> BinaryIO:
        """The input's decompressed bytes (gzip detected by magic, not by name)."""
        if self.text is not None:
            return io.BytesIO(self.text)
        raw: io.BufferedReader = sys.stdin.buffer if self.path is None else open(self.path, "rb")  # type: ignore[assignment]  # noqa: SIM115
        if raw.peek(2)[:2] == b"\x1f\x8b":
            return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
        return raw

    def year(self) -> int:
        """Year assumed for year-less (glog) timestamps until a log line states one."""
        try:
            if self.path is not None:
                return datetime.fromtimestamp(self.path.stat().st_mtime).year
        except OSError:
            pass
        return datetime.now().year


def _walk(top: Path, shown: str, root: Path | None, skipped: list[str]) -> Iterator[Source]:
    for dirpath, dirnames, filenames in os.walk(top, onerror=None):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            label = os.path.join(shown, os.path.relpath(path, top))
            if not path.is_file():
                continue
            if root is not None and not path.resolve().is_relative_to(root):
                skipped.append(f"{label} (links outside the workspace)")
                continue
            yield Source(name=label, path=path, walked=True)


def collect(paths: list[str], root: Path | None) -> tuple[list[Source], list[str]]:
    """Expand the requested paths into sources (files in walk order); missing paths are an error."""
    sources: list[Source] = []
    skipped: list[str] = []
    for raw in paths:
        if raw == STDIN and root is None:
            sources.append(Source(name="<stdin>"))
            continue
        path = confine(raw, root) if root is not None else Path(raw).expanduser()
        shown = str(path.relative_to(root)) if root is not None else raw
        if path.is_dir():
            sources.extend(_walk(path, shown, root, skipped))
        elif path.exists():
            sources.append(Source(name=shown, path=path))
        else:
            raise MMAgentError(
                f"{raw}: no such file or directory",
                file=raw,
                field="paths",
                fix="pass existing log files or directories" + (" inside the workspace" if root else ""),
            )
    return sources, skipped


def _blocks(stream: BinaryIO, damage: list[str]) -> Iterator[bytes]:
    """Blocks of about BLOCK bytes; on a read error (damaged gzip, I/O) what came before is still given."""
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            data = stream.read1(BLOCK - size)  # type: ignore[attr-defined]
        except (OSError, EOFError, zlib.error) as exc:
            damage.append(str(exc) or type(exc).__name__)
            data = b""
        if data:
            parts.append(data)
            size += len(data)
        if parts and (size >= BLOCK or not data):
            yield b"".join(parts)
            parts, size = [], 0
        if not data:
            return


def read_source(ctx: ScanContext, source: Source, index: int) -> None:
    """Scan one input to its end, block by block; damage (bad gzip, I/O errors) becomes a note."""
    try:
        stream = source.open()
    except OSError as exc:
        ctx.skipped.append(f"{source.name} ({exc.strerror or exc})")
        return
    scan = FileScan(ctx, source.name, index, rank_from_path(source.name), source.year())
    damage: list[str] = []
    with stream:
        for n, block in enumerate(_blocks(stream, damage)):
            if n == 0 and source.walked and b"\x00" in block[:BINARY_SNIFF]:
                ctx.skipped.append(f"{source.name} (binary)")
                return
            scan.feed(block)
    ctx.files.append(source.name)
    if damage:
        ctx.note(f"{source.name}: stopped reading after {scan.lines} lines: {damage[0]}")
    scan.finish()
