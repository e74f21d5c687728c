"""The Jinja setup's compiled-template cache: used across processes, never from a folder others can write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mm_agent import templating

RENDER = """
import hashlib, sys
from mm_agent.render import RenderRequest, render_job
res = render_job(RenderRequest(model="wan2.1", task="t2v", out_dir=sys.argv[1]))
print(hashlib.sha256("".join(f.path + (f.content or "") for f in res.files).encode()).hexdigest())
"""


def _render(tmp_path: Path, state: Path) -> str:
    env = {**os.environ, "MM_AGENT_STATE_DIR": str(state)}
    out = subprocess.run(
        [sys.executable, "-c", RENDER, str(tmp_path / "job")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


def test_a_second_process_renders_the_same_job_from_the_compiled_templates(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = _render(tmp_path, state)
    assert not state.exists()  # a render never makes the state directory just for its cache
    state.mkdir()
    assert _render(tmp_path, state) == first
    cached = sorted((state / "jinja").iterdir())
    assert cached and all(p.suffix == ".cache" for p in cached)
    assert (state / "jinja").stat().st_mode & 0o777 == 0o700
    stamps = {p.name: p.stat().st_mtime_ns for p in cached}
    assert _render(tmp_path, state) == first  # from the cache
    again = {p.name: p.stat().st_mtime_ns for p in (state / "jinja").iterdir()}
    assert again == stamps  # read, not rewritten


def test_a_cache_folder_others_can_write_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path))
    (tmp_path / "jinja").mkdir(mode=0o700)
    assert templating._bytecode_cache() is not None
    os.chmod(tmp_path / "jinja", 0o777)
    assert templating._bytecode_cache() is None
    os.chmod(tmp_path / "jinja", 0o700)
    (tmp_path / "jinja").rmdir()
    (tmp_path / "jinja").write_text("not a folder")
    assert templating._bytecode_cache() is None
