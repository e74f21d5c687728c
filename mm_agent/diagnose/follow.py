"""`--follow`: diagnose logs while they grow, and stop as soon as the root cause is known.

HCCL waits up to 1800 s before the surviving ranks give up, so a user watching a dead job learns nothing
for half an hour. Following polls every `poll` seconds (stat, then read only what was appended), re-walks
followed directories for new files (a rank's log or plog appearing), and returns:
  * at once when a primary fatal finding is seen;
  * `grace` seconds after the first secondary fatal one (ChildFailedError, a comm timeout) when no primary
    came meanwhile, since the cause is often written a moment later or on another rank;
  * at `timeout`, when no input can grow any more (stdin ended), or on Ctrl-C, with what is known so far.
A file that shrinks or is replaced (rotation) is read again from its start. Files are opened as
`reader.py` opens them (regular files only, re-checked against the workspace after the open), every poll.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mm_agent.diagnose.catalog import get_catalog
from mm_agent.diagnose.ranks import rank_from_path
from mm_agent.diagnose.reader import BINARY_SNIFF, BLOCK, Source, collect, read_source
from mm_agent.diagnose.rootcause import build_report
from mm_agent.diagnose.scan import FileScan, ScanContext
from mm_agent.diagnose.schema import DiagnosisReport
from mm_agent.errors import MMAgentError
from mm_agent.paths import open_file

POLL_S = 0.2
GRACE_S = 1.0


@dataclass
class _Tail:
    source: Source
    scan: FileScan
    offset: int = 0
    inode: int | None = None
    done: bool = False  # read once (gzip, text), skipped as binary, or stdin at its end


class Follower:
    """The followed inputs and their incremental scans (one `ScanContext` for them all)."""

    def __init__(self, paths: list[str], text: str | None, root: Path | None, max_evidence: int):
        self.paths = paths
        self.root = root.resolve() if root is not None else None
        self.ctx = ScanContext(get_catalog(), max_evidence)
        self.tails: dict[str, _Tail] = {}
        sources, skipped = collect(paths, self.root)  # missing paths fail here, once
        self.ctx.skipped.extend(skipped)
        if text is not None:
            sources.append(Source(name="<text>", text=text.encode("utf-8", "replace")))
        self._add(sources)

    def _add(self, sources: list[Source]) -> None:
        for source in sources:
            if source.name in self.tails:
                continue
            index = len(self.tails)
            scan = FileScan(self.ctx, source.name, index, rank_from_path(source.name), source.year())
            tail = self.tails[source.name] = _Tail(source, scan)
            if source.text is not None or _is_gzip(source):
                read_source(self.ctx, source, index)
                tail.done = True
            else:
                self.ctx.files.append(source.name)

    def discover(self) -> None:
        """Pick up files that appeared in followed directories since the last poll."""
        dirs = [p for p in self.paths if p != "-" and self._is_dir(p)]
        if not dirs:
            return
        try:
            sources, skipped = collect(dirs, self.root)
        except MMAgentError:  # a followed directory was removed: keep what we have
            return
        self.ctx.skipped.extend(s for s in skipped if s not in self.ctx.skipped)
        self._add(sources)

    def _is_dir(self, raw: str) -> bool:
        path = Path(raw).expanduser()
        if self.root is not None and not path.is_absolute():
            path = self.root / path
        return path.is_dir()

    def poll(self) -> None:
        for tail in self.tails.values():
            if tail.done:
                continue
            if tail.source.path is None:
                self._read_stdin(tail)
            else:
                self._read_file(tail, tail.source.path)

    def _read_file(self, tail: _Tail, path: Path) -> None:
        try:
            st = path.stat()
        except OSError:
            return  # gone for now (rotation in progress); it may come back
        if tail.inode is not None and (st.st_ino != tail.inode or st.st_size < tail.offset):
            self.ctx.note(f"{tail.source.name}: truncated or replaced; read again from the start")
            tail.scan.finish()
            tail.scan = FileScan(
                self.ctx, tail.source.name, tail.scan.index, tail.scan.path_rank, tail.scan.year
            )
            tail.offset = 0
        tail.inode = st.st_ino
        if st.st_size <= tail.offset:
            return
        try:
            with open_file(path, tail.source.root, "paths") as f:
                f.seek(tail.offset)
                while tail.offset < st.st_size:
                    data = f.read(min(BLOCK, st.st_size - tail.offset))
                    if not data:
                        break
                    if tail.offset == 0 and tail.source.walked and b"\x00" in data[:BINARY_SNIFF]:
                        self.ctx.files.remove(tail.source.name)
                        self.ctx.skipped.append(f"{tail.source.name} (binary)")
                        tail.done = True
                        return
                    tail.offset += len(data)
                    tail.scan.feed(data)
        except MMAgentError as exc:
            if not path.exists():
                return  # gone between the stat and the open (rotation): it may come back
            # replaced by a FIFO or device, or by a link leading outside: stop following it
            self.ctx.note(f"{tail.source.name}: {exc.message}; no longer followed")
            tail.done = True
        except OSError as exc:
            self.ctx.note(f"{tail.source.name}: {exc.strerror or exc}")

    def _read_stdin(self, tail: _Tail) -> None:
        fd = 0
        for _ in range(64):  # at most 64 reads per poll so files are not starved
            ready, _, _ = select.select([fd], [], [], 0)
            if not ready:
                return
            data = os.read(fd, BLOCK)
            if not data:
                tail.done = True
                return
            tail.scan.feed(data)

    def exhausted(self) -> bool:
        """Nothing can grow any more: every input was read once (text, gzip) or ended (stdin), no dirs."""
        return all(t.done for t in self.tails.values()) and not any(
            p != "-" and self._is_dir(p) for p in self.paths
        )

    def report(self, why: str) -> DiagnosisReport:
        for tail in self.tails.values():
            tail.scan.finish()
        self.ctx.note(why)
        return build_report(self.ctx)


def _is_gzip(source: Source) -> bool:
    """Whether a file starts with gzip's magic; a file that cannot be opened is left to `read_source`."""
    if source.path is None:
        return False
    try:
        with open_file(source.path, source.root, "paths") as f:
            return f.read(2) == b"\x1f\x8b"
    except (MMAgentError, OSError):
        return False


def follow(
    paths: list[str],
    text: str | None = None,
    root: Path | None = None,
    *,
    max_evidence: int = 5,
    timeout: float | None = None,
    poll: float = POLL_S,
    grace: float = GRACE_S,
    on_ready: Callable[[int], None] | None = None,
) -> DiagnosisReport:
    """Follow growing logs until a fatal root cause is seen (see the module doc for when it returns).

    `on_ready(n_inputs)` is called once what was already written has been read.
    """
    follower = Follower(paths, text, root, max_evidence)
    start = time.monotonic()
    secondary_since: float | None = None
    try:
        while True:
            follower.discover()
            follower.poll()
            if on_ready is not None:
                on_ready(len(follower.tails))
                on_ready = None
            now = time.monotonic()
            if follower.ctx.seen("primary", "fatal"):
                return follower.report("follow: stopped at the first fatal root cause")
            if secondary_since is None and follower.ctx.seen("secondary", "fatal"):
                secondary_since = now
            if secondary_since is not None and now - secondary_since >= grace:
                return follower.report(f"follow: stopped {grace:g} s after a fatal symptom, no cause seen")
            if timeout is not None and now - start >= timeout:
                return follower.report(f"follow: stopped after the {timeout:g} s timeout")
            if follower.exhausted():
                return follower.report("follow: every input has ended")
            time.sleep(poll)
    except KeyboardInterrupt:
        return follower.report("follow: interrupted; summary so far")
