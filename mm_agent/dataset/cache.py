"""Probe results kept between runs, per dataset root: a re-run re-probes only files whose size or mtime
changed (musubi-tuner's `--skip_existing`, by file identity instead of by output).

One JSON line per probed file, appended as results arrive and flushed per batch, so a scan that is killed
keeps what it finished; a cut-off last line is skipped on load and later lines win. The file lives in
mm-agent's state directory (`datasets/<hash of the root>.jsonl`), never in the user's data folder; it is
rewritten compactly once it holds more stale lines than live ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, TextIO

from mm_agent.procs import state_dir


def cache_path(root: Path) -> Path:
    key = hashlib.sha256(os.fsencode(root)).hexdigest()[:24]  # (the name's bytes: it may not be UTF-8)
    return state_dir() / "datasets" / f"{key}.jsonl"


class ProbeCache:
    def __init__(self, root: Path) -> None:
        self.path = cache_path(root)
        self.entries: dict[str, dict[str, Any]] = {}
        self._lines = 0
        self._out: TextIO | None = None
        try:
            with self.path.open(encoding="utf-8") as fh:
                for line in fh:
                    self._lines += 1
                    try:
                        entry = json.loads(line)
                        self.entries[entry["rel"]] = entry["probe"]
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut off by a kill
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError):
            self.entries = {}  # an unreadable cache is only slower, never wrong

    def get(self, rel: str, size: int, mtime_ns: int) -> dict[str, Any] | None:
        hit = self.entries.get(rel)
        if hit is not None and hit.get("size") == size and hit.get("mtime_ns") == mtime_ns:
            return hit
        return None

    def put(self, rel: str, probe: dict[str, Any]) -> None:
        self.entries[rel] = probe
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._out = self.path.open("a", encoding="utf-8")
        self._out.write(json.dumps({"rel": rel, "probe": probe}, separators=(",", ":")) + "\n")
        self._lines += 1

    def flush(self) -> None:
        if self._out is not None:
            self._out.flush()

    def close(self, live: set[str] | None = None) -> None:
        """Flush; drop entries of files no longer there and compact when most lines are stale."""
        if self._out is not None:
            self._out.close()
            self._out = None
        if live is not None:
            self.entries = {k: v for k, v in self.entries.items() if k in live}
        if self._lines > 2 * max(len(self.entries), 1) and self.path.exists():
            # a random temp name: calls of one server (threads of one process) may compact the same cache
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    for rel, probe in self.entries.items():
                        fh.write(json.dumps({"rel": rel, "probe": probe}, separators=(",", ":")) + "\n")
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
