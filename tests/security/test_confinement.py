"""Confinement on every path, resolved at use (issue 12, item 3), through a real in-process MCP client.

Holes guarded here: render_job's path fields were not confined (extraction and training then read and
wrote outside the workspace); `render_job(out_dir=".", force)` moved the whole workspace to a backup
outside it; a parent swapped for a symlink between the check and the open leaked outside files through
resources/read and let render_job leave temp dirs outside; symlink loops, a NUL and a full disk came back
as an opaque "Error executing tool".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mm_agent import paths, render, resources
from mm_agent.errors import MMAgentError
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server
from security.common import PATH_FIELDS


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace, a directory beside it that is outside it)."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n", encoding="utf-8")
    return ws, outside


def _call(ws: Path, tool: str, args: dict[str, Any], allow: tuple[Path, ...] = ()) -> Any:
    async def go() -> Any:
        async with Client(build_server(ws, allow_roots=allow)) as client:
            return await client.call_tool(tool, args)

    return anyio.run(go)


def _error(result: Any) -> str:
    assert result.is_error, result.structured_content
    text: str = result.content[0].text
    assert "fix:" in text, text  # every refusal names its fix
    return text


@pytest.mark.parametrize("field", PATH_FIELDS)
def test_render_path_fields_outside_the_workspace_are_refused(place: tuple[Path, Path], field: str) -> None:
    ws, outside = place
    args = {"model": "wan2.1", "task": "t2v", "out_dir": "jobs/w", field: str(outside / "x")}
    text = _error(_call(ws, "render_job", args))
    assert field in text and "outside" in text
    # the same through a symlink inside the workspace that leads outside
    (ws / "link").symlink_to(outside, target_is_directory=True)
    args[field] = "link/x"
    assert field in _error(_call(ws, "render_job", args))
    assert not (ws / "jobs").exists()


@pytest.mark.parametrize("field", PATH_FIELDS)
def test_an_allowed_root_admits_the_path(place: tuple[Path, Path], field: str) -> None:
    ws, outside = place
    args = {"model": "wan2.1", "task": "t2v", "out_dir": "jobs/w", field: str(outside / "x")}
    result = _call(ws, "render_job", args, allow=(outside,))
    assert not result.is_error, result.content[0].text


def test_a_job_rendered_outside_cannot_be_launched_over_mcp(place: tuple[Path, Path]) -> None:
    """The CLI trusts its operator: a job it rendered with an outside save_path is refused when launched
    through the server, which re-resolves the job's paths at use."""
    ws, outside = place
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            runtime="bundled",
            out_dir=str(ws / "jobs/w"),
            save_path=str(outside),
            confirm=True,
        )
    )
    text = _error(_call(ws, "launch_training", {"job_dir": "jobs/w"}))
    assert "save_path" in text and "outside" in text


@pytest.mark.parametrize("out_dir", [".", "", "..", "{ws}", "{parent}", "jobs/.."])
def test_out_dir_is_never_the_workspace_or_its_parent(place: tuple[Path, Path], out_dir: str) -> None:
    ws, _ = place
    (ws / "mine.txt").write_text("the user's file\n", encoding="utf-8")
    value = out_dir.format(ws=ws, parent=ws.parent)
    args = {"model": "wan2.1", "task": "t2v", "out_dir": value, "confirm": True, "force": True}
    text = _error(_call(ws, "render_job", args))
    assert "out_dir" in text
    assert (ws / "mine.txt").read_text(encoding="utf-8") == "the user's file\n"
    assert sorted(p.name for p in ws.parent.iterdir()) == ["outside", "ws"]  # no backup anywhere


def test_a_job_at_the_workspace_root_is_not_replaced_with_the_workspace(place: tuple[Path, Path]) -> None:
    """Even when the workspace itself holds a rendered job (the CLI may have rendered one there), replacing
    it would move the workspace to a backup beside it, outside."""
    ws, _ = place
    render_job(RenderRequest(model="wan2.1", task="t2v", out_dir=str(ws), confirm=True))
    (ws / "mine.txt").write_text("the user's file\n", encoding="utf-8")
    args = {"model": "wan2.1", "task": "i2v", "out_dir": ".", "confirm": True, "force": True}
    assert "out_dir" in _error(_call(ws, "render_job", args))
    assert sorted(p.name for p in ws.parent.iterdir()) == ["outside", "ws"]
    assert (ws / "mine.txt").is_file() and (ws / "job.yaml").is_file()


def test_out_dir_is_never_an_allowed_root(place: tuple[Path, Path]) -> None:
    ws, outside = place
    args = {"model": "wan2.1", "task": "t2v", "out_dir": str(outside), "confirm": True, "force": True}
    assert "out_dir" in _error(_call(ws, "render_job", args, allow=(outside,)))
    assert (outside / "secret.txt").is_file()


def test_a_directory_that_is_not_a_job_is_never_replaced(place: tuple[Path, Path]) -> None:
    ws, _ = place
    (ws / "data").mkdir()
    (ws / "data" / "clip.mp4").write_bytes(b"\x00" * 16)
    args = {"model": "wan2.1", "task": "t2v", "out_dir": "data", "confirm": True, "force": True}
    assert "no rendered job" in _error(_call(ws, "render_job", args))
    assert [p.name for p in ws.iterdir()] == ["data"]
    assert (ws / "data" / "clip.mp4").stat().st_size == 16


def _swap_after_confine(
    monkeypatch: pytest.MonkeyPatch, module: Any, swap: tuple[Path, Path], when: str
) -> None:
    """Make the check pass, then replace `swap[0]` by a symlink to `swap[1]` before the path is used: the
    race an attacker wins by timing, made deterministic."""
    real = paths.confine
    parent, target = swap

    def confine_then_swap(user_path: str, root: Path, *field: str) -> Path:
        resolved = real(user_path, root, *field)
        if (field or ("path",))[0] == when:
            parent.rename(parent.with_name(parent.name + ".moved"))
            parent.symlink_to(target, target_is_directory=True)
        return resolved

    monkeypatch.setattr(module, "confine", confine_then_swap)


def test_resource_read_after_a_parent_swap_does_not_leak(
    place: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, outside = place
    render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="jobs/w", confirm=True), root=ws)
    fake_job = outside / "w"
    fake_job.mkdir()
    (fake_job / "job.yaml").write_text("model: wan2.1\ntask: t2v\n", encoding="utf-8")
    (fake_job / "pretrain.sh").write_text("TOP SECRET\n", encoding="utf-8")
    _swap_after_confine(monkeypatch, resources, (ws / "jobs" / "w", fake_job), "path")
    with pytest.raises(MMAgentError) as err:
        resources.read_job_file("jobs/w/pretrain.sh", ws)
    assert "outside" in err.value.message and err.value.fix
    assert "TOP SECRET" not in err.value.render()


def test_render_after_a_parent_swap_writes_nothing_outside(
    place: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every check passed; `jobs` becomes a symlink to the outside just before the files are written."""
    ws, outside = place
    (ws / "jobs").mkdir()
    real = render.render_files

    def render_then_swap(job: Any) -> dict[str, str]:
        files = real(job)  # the last step before the files are written
        (ws / "jobs").rename(ws / "jobs.moved")
        (ws / "jobs").symlink_to(outside, target_is_directory=True)
        return files

    monkeypatch.setattr(render, "render_files", render_then_swap)
    with pytest.raises(MMAgentError) as err:
        render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="jobs/new", confirm=True), root=ws)
    assert "symlink" in err.value.message and err.value.fix
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]  # no job, no temp dir
    assert list((ws / "jobs.moved").iterdir()) == []


def test_symlink_loop_is_an_error_with_the_fix(place: tuple[Path, Path]) -> None:
    ws, _ = place
    (ws / "loop").symlink_to(ws / "loop")
    text = _error(_call(ws, "render_job", {"model": "wan2.1", "task": "t2v", "out_dir": "loop/job"}))
    assert "symlink loop" in text and "Error executing tool render_job:" in text


def test_nul_in_mm_root_is_refused_with_the_fix(place: tuple[Path, Path]) -> None:
    ws, _ = place
    text = _error(
        _call(ws, "render_job", {"model": "wan2.1", "task": "t2v", "out_dir": "j", "mm_root": "a\x00b"})
    )
    assert "mm_root" in text and "NUL" in text


@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0, reason="needs root and unshare(1)")
def test_a_full_disk_during_render_is_named_and_leaves_no_job(tmp_path: Path) -> None:
    """A real ENOSPC: the workspace is a 64 KiB tmpfs (in a private mount namespace) filled to the brim."""
    ws = tmp_path / "ws"
    ws.mkdir()
    script = textwrap.dedent(
        f"""
        import json, os
        from pathlib import Path
        from mm_agent.errors import MMAgentError
        from mm_agent.render import RenderRequest, render_job
        ws = Path({str(ws)!r})
        with open(ws / "filler", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"x" * 4096)
            except OSError:
                pass
        try:
            render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="jobs/w", confirm=True), root=ws)
            print(json.dumps({{"ok": True}}))
        except MMAgentError as exc:
            left = sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if not p.is_dir())
            print(json.dumps({{"message": exc.message, "fix": exc.fix, "left": left}}))
        """
    )
    mount = f'mount -t tmpfs -o size=64k tmpfs {ws} && exec {sys.executable} -c "$0"'
    try:
        out = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, script],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("render on a full disk hung")
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report.get("message") == "no space left on the device", report
    assert "free disk space" in report["fix"]
    assert report["left"] == ["filler"]  # no half-written job, no temp dir
