"""`paths.read_upto`: what validate and the new-model rules read of a file, up to a cap, without asking for the
whole cap (a `read(cap + 1)` allocates it for every file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mm_agent import paths
from mm_agent.paths import open_file, read_upto


def _read(path: Path, limit: int) -> bytes:
    with open_file(path) as fh:
        return read_upto(fh, limit)


def test_a_file_under_the_cap_is_read_whole_and_one_over_it_shows(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 100)
    assert _read(path, 1000) == b"x" * 100
    assert _read(path, 100) == b"x" * 100  # exactly at the cap: not over
    assert _read(path, 99) == b"x" * 100  # cap + 1 bytes: over it
    assert _read(path, 10) == b"x" * 11


def test_a_file_that_grew_after_fstat_is_read_on_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "growing.json"
    path.write_bytes(b"y" * 5000)
    real_fstat = os.fstat

    def stale(fd: int) -> os.stat_result:  # what fstat said before the writer added 4,990 bytes
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, *st[1:6], 10, *st[7:]))

    monkeypatch.setattr(paths.os, "fstat", stale)
    assert _read(path, 100_000) == b"y" * 5000
    assert _read(path, 3000) == b"y" * 3001  # and still stops one past the cap
