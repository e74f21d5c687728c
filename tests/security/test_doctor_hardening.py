"""The doctor never executes a workspace file as an interpreter, and nothing it starts outlives the call
(issue 12, item 2), driven through a real in-process MCP client.

Holes guarded here: `check_environment` (annotated read-only) ran any workspace file given as `python`
(`render_job` then `check_environment(python="<job>/finetune.sh")` ran the script); a timed-out probe
left what it started running (only the direct child was killed); `check_environment(job=...)` probed a
job's `mm_root` outside the workspace.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client

from mm_agent.doctor import CHECKS, DoctorReport, DoctorRequest
from mm_agent.doctor.context import Context
from mm_agent.doctor.registry import run_checks
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server

HANG_GUARD_S = 120  # never reached when the doctor works; a hang fails the test instead of the suite


@pytest.fixture(autouse=True)
def _no_mm_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient MM_ROOT: the workspace (`ws`, tests/conftest.py) is all these tests see."""
    monkeypatch.delenv("MM_ROOT", raising=False)


def _call(ws: Path, tool: str, args: dict[str, Any]) -> Any:
    async def go() -> Any:
        with anyio.fail_after(HANG_GUARD_S):
            async with Client(build_server(ws)) as client:
                return await client.call_tool(tool, {**args, "detail": True})  # the whole report

    return anyio.run(go)


def _error(result: Any) -> str:
    assert result.is_error, result.structured_content
    text: str = result.content[0].text
    assert "fix:" in text, text
    return text


def _report(result: Any) -> DoctorReport:
    assert not result.is_error, result.content[0].text
    return DoctorReport.model_validate(result.structured_content)


def _venv(where: Path, base: str = sys.executable, copies: bool = False) -> Path:
    """A real venv (no pip); returns its site-packages."""
    argv = [base, "-m", "venv", "--without-pip", *(["--copies"] if copies else []), str(where)]
    subprocess.run(argv, check=True)
    return next((where / "lib").glob("python3*/site-packages"))


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not ours counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(pidfile: Path) -> list[int]:
    return [int(p) for p in pidfile.read_text(encoding="utf-8").split()]


@pytest.fixture
def reap() -> Any:
    """Pids a test recorded; anything still alive at the end is killed (a failing test leaks nothing)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            psutil.Process(pid).kill()


# ---------------------------------------------------------------------------------------------------------
# python must be an interpreter by its own identity


def _rendered_script(ws: Path) -> str:
    """The repro: a job rendered through the server, its finetune.sh then given as `python`."""
    args = {"model": "qwen2.5vl", "task": "sft", "out_dir": "job", "confirm": True}
    assert not _call(ws, "render_job", args).is_error
    return "job/finetune.sh"


def _sh_script(ws: Path) -> str:
    (ws / "probe.sh").write_text(f"#!/bin/sh\ntouch {ws / 'canary'}\n", encoding="utf-8")
    (ws / "probe.sh").chmod(0o755)
    return "probe.sh"


def _bash_copy(ws: Path) -> str:
    shutil.copy2("/bin/bash", ws / "python")  # a non-Python ELF named python, inside the workspace
    return "python"


def _bash_link(ws: Path) -> str:
    (ws / "bin").mkdir()
    (ws / "bin" / "python").symlink_to("/bin/bash")  # shaped like a venv's bin/python
    return "bin/python"


@pytest.mark.parametrize("make", [_rendered_script, _sh_script, _bash_copy, _bash_link])
def test_a_script_or_shell_as_python_is_refused_and_not_run(
    ws: Path, monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    # Any bash that starts (a #!/bin/bash script, a copy of bash) sources $BASH_ENV first: the canary.
    canary = ws / "canary"
    (ws / "canary.rc").write_text(f"touch {canary}\n", encoding="utf-8")
    monkeypatch.setenv("BASH_ENV", str(ws / "canary.rc"))
    python = make(ws)
    text = _error(_call(ws, "check_environment", {"python": python, "checks": ["python_version"]}))
    assert "python" in text and "not a Python interpreter" in text
    assert "<venv>/bin/python" in text  # the fix names what to pass
    assert not canary.exists(), "the doctor executed the file it was given as `python`"


@pytest.mark.parametrize("base", [sys.executable, "/usr/bin/python3"])
def test_a_real_venv_inside_the_workspace_is_accepted(ws: Path, base: str) -> None:
    """A venv's bin/python is a symlink to a system interpreter outside the workspace: that is fine, its
    folder is inside. Both a libpython-linked (pyenv) and a static (Debian) interpreter pass."""
    if not Path(base).exists():
        pytest.skip(f"{base} is not on this machine")
    _venv(ws / "venv", base)
    report = _report(
        _call(ws, "check_environment", {"python": "venv/bin/python", "checks": ["python_version"]})
    )
    check = report.checks[0]
    assert check.status in {"ok", "warn"}, check
    assert f"interpreter: {ws / 'venv' / 'bin' / 'python'}" in check.evidence[0]
    assert report.machine.python_executable == str(ws / "venv" / "bin" / "python")


# ---------------------------------------------------------------------------------------------------------
# nothing a probe starts outlives the call


def _torch(site: Path, code: str) -> None:
    """A `torch` (with torch and torch_npu metadata) that runs `code` when the torch_npu_import check's probe
    imports it. (A .pth line no longer runs at all: tests/security/test_code_execution.py.)"""
    for name in ("torch", "torch_npu"):
        info = site / f"{name}-2.7.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 2.7.1\n", encoding="utf-8"
        )
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        "import os, subprocess, time\n" + code + "\n__version__ = '2.7.1'\n", encoding="utf-8"
    )


IMPORTS_TORCH = {"python": "venv/bin/python", "checks": ["torch_npu_import"]}


def test_a_hanging_probe_is_stopped_with_everything_it_started(ws: Path, reap: list[int]) -> None:
    """`import torch` in the probe starts a `sleep` in its own group and one in a new session (as torchrun's
    workers are), then hangs: at the timeout all three die, and the call still answers."""
    pidfile = ws / "pids"
    site = _venv(ws / "venv", copies=True)
    _torch(
        site,
        'a = subprocess.Popen(["sleep", "600"]); '
        'b = subprocess.Popen(["sleep", "600"], start_new_session=True); '
        f"open({str(pidfile)!r}, 'a').write(f'{{os.getpid()}} {{a.pid}} {{b.pid}} '); "
        "time.sleep(600)",
    )
    report = _report(_call(ws, "check_environment", {**IMPORTS_TORCH, "timeout_s": 5}))
    pids = _pids(pidfile)
    reap.extend(pids)
    assert [pid for pid in pids if _alive(pid)] == [], "the probe left processes running"
    check = report.checks[0]
    assert check.status == "warn" and re.search(r"did not finish .* within [\d.]+ s", check.summary), check


def test_a_probe_that_leaves_a_background_process_leaves_nothing(ws: Path, reap: list[int]) -> None:
    """`import torch` in the probe daemonizes a `sleep` (new session, output detached) and a plain child,
    then the probe answers normally: the answer is used, and neither sleeper survives the call."""
    pidfile = ws / "pids"
    site = _venv(ws / "venv", copies=True)
    _torch(
        site,
        'd = subprocess.Popen(["sleep", "600"], start_new_session=True, stdout=subprocess.DEVNULL, '
        "stderr=subprocess.DEVNULL); "
        'c = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); '
        f"open({str(pidfile)!r}, 'a').write(f'{{d.pid}} {{c.pid}} ')",
    )
    report = _report(_call(ws, "check_environment", IMPORTS_TORCH))
    pids = _pids(pidfile)
    reap.extend(pids)
    check = report.checks[0]  # the probe's answer was used: torch imported, then torch_npu did not
    assert check.status == "fail" and "No module named 'torch_npu'" in " ".join(check.evidence), check
    assert [pid for pid in pids if _alive(pid)] == [], "the probe's background processes survived"


def test_a_hanging_npu_smi_is_stopped_with_what_it_started(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reap: list[int]
) -> None:
    """npu-smi runs contained too: a stand-in that backgrounds a sleeper and then hangs is killed at the
    timeout together with the sleeper."""
    pidfile = tmp_path / "pids"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(
        f'#!/bin/sh\nsleep 600 >/dev/null 2>&1 &\necho "$$ $!" > {pidfile}\nexec sleep 600\n',
        encoding="utf-8",
    )
    (bin_dir / "npu-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    report = _report(_call(ws, "check_environment", {"checks": ["npu_devices"], "timeout_s": 3}))
    pids = _pids(pidfile)
    reap.extend(pids)
    assert [pid for pid in pids if _alive(pid)] == [], "npu-smi left processes running"
    (check,) = report.checks
    assert check.status == "fail" and "did not answer" in check.summary, check


# ---------------------------------------------------------------------------------------------------------
# a job's paths are confined


def _fake_checkout(root: Path) -> Path:
    (root / "mindspeed_mm").mkdir(parents=True)
    return root


def test_a_job_whose_mm_root_is_outside_is_not_probed(ws: Path, tmp_path: Path) -> None:
    """The CLI trusts its operator and renders a job with an outside mm_root; the server then refuses to
    look at that job (every path of it is confined), naming mm_root and the fix."""
    outside = _fake_checkout(tmp_path / "outside" / "MindSpeed-MM")
    render_job(
        RenderRequest(
            model="qwen2.5vl", task="sft", out_dir=str(ws / "job"), mm_root=str(outside), confirm=True
        )
    )
    text = _error(_call(ws, "check_environment", {"job": "job", "checks": ["mm_checkout"]}))
    assert "mm_root" in text and "outside" in text and str(outside) in text


def test_a_checkout_swapped_for_an_outside_symlink_is_not_probed(ws: Path, tmp_path: Path) -> None:
    """mm_root was inside when the job was resolved, then became a symlink to an outside checkout before
    the check looked at it: the check fails naming mm_root instead of reporting on the outside tree."""
    inside = _fake_checkout(ws / "MindSpeed-MM")
    outside = _fake_checkout(tmp_path / "outside" / "MindSpeed-MM")
    render_job(RenderRequest(model="qwen2.5vl", task="sft", out_dir="job", confirm=True), root=ws)
    ctx = Context.build(DoctorRequest(job="job", checks=["mm_checkout"]), root=ws)
    assert ctx.mm_root == inside
    inside.rename(ws / "moved")
    inside.symlink_to(outside, target_is_directory=True)
    (result,) = run_checks(ctx, [CHECKS["mm_checkout"]])
    assert result.status == "fail" and "mm_root" in result.summary and "outside" in result.summary
    assert result.fix and "inside the workspace" in result.fix
    assert str(outside) not in " ".join(result.evidence)


def test_a_workspace_checkout_symlink_leading_outside_is_not_probed(ws: Path, tmp_path: Path) -> None:
    """With no mm_root given, the doctor looks for ./MindSpeed-MM in the workspace; a symlink there that
    leads outside must not make it inspect the outside tree."""
    outside = _fake_checkout(tmp_path / "outside" / "MindSpeed-MM")
    (ws / "MindSpeed-MM").symlink_to(outside, target_is_directory=True)
    report = _report(_call(ws, "check_environment", {"checks": ["mm_checkout"]}))
    (check,) = report.checks
    assert check.status == "fail" and "mm_root" in check.summary and "outside" in check.summary, check
    assert check.fix and "inside the workspace" in check.fix


def test_an_editable_install_outside_leaks_no_file_as_its_commit(ws: Path, tmp_path: Path) -> None:
    """An editable install's checkout is read from its .git/HEAD; one recorded as living outside the
    workspace (with HEAD a file the server can read) must not have that file's first line reported as
    its "commit"."""
    src = tmp_path / "outside" / "MindSpeed"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("SECRETSECRETSECRET\n", encoding="utf-8")
    site = _venv(ws / "venv", copies=True)
    (site / "mindspeed").mkdir()
    (site / "mindspeed" / "__init__.py").write_text("", encoding="utf-8")
    info = site / "mindspeed-0.12.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mindspeed\nVersion: 0.12.1\n", encoding="utf-8"
    )
    (info / "direct_url.json").write_text(
        json.dumps({"url": src.as_uri(), "dir_info": {"editable": True}}), encoding="utf-8"
    )
    args = {"python": "venv/bin/python", "model": "wan2.1", "checks": ["mindspeed", "model_deps"]}
    report = _report(_call(ws, "check_environment", args))
    text = json.dumps(report.model_dump(mode="json"))
    assert "SECRET" not in text, "an outside file's content was reported as a commit"
    mindspeed = next(c for c in report.checks if c.id == "mindspeed")
    assert any("outside the workspace" in e for e in mindspeed.evidence), mindspeed


@pytest.fixture
def fifos() -> Any:
    """FIFOs a test planted; at the end each is opened for writing once, which releases a reader blocked
    on it (only a broken doctor would be one), so no thread stays stuck."""
    planted: list[Path] = []
    yield planted
    for fifo in planted:
        with contextlib.suppress(OSError):  # ENXIO: no reader, nothing was blocked
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_fifos_in_a_checkout_or_a_job_are_refused_not_read(ws: Path, fifos: list[Path]) -> None:
    """A FIFO planted as the checkout's .git/HEAD or as a job script blocked the check that opened it
    until the deadline (and its thread forever); now both are refused before they are opened."""
    checkout = _fake_checkout(ws / "MindSpeed-MM")
    (checkout / ".git").mkdir()
    os.mkfifo(checkout / ".git" / "HEAD")
    render_job(RenderRequest(model="qwen2.5vl", task="sft", out_dir="job", confirm=True), root=ws)
    os.mkfifo(ws / "job" / "stuck.sh")
    fifos.extend([checkout / ".git" / "HEAD", ws / "job" / "stuck.sh"])
    args = {
        "job": "job",
        "mm_root": "MindSpeed-MM",
        "checks": ["mm_checkout", "crlf_scripts"],
        "timeout_s": 2,
    }
    report = _report(_call(ws, "check_environment", args))
    by_id = {c.id: c for c in report.checks}
    assert all("did not finish" not in c.summary for c in report.checks), report.checks
    assert not any(e.startswith("git HEAD") for e in by_id["mm_checkout"].evidence)
    crlf = by_id["crlf_scripts"]
    assert crlf.status == "fail" and any("stuck.sh: not read" in e and "FIFO" in e for e in crlf.evidence)
    assert crlf.fix and "re-render" in crlf.fix


def test_probe_processes_are_in_their_own_group_and_marked(ws: Path) -> None:
    """The probe's interpreter runs as a group leader (so the group can be killed) and carries the
    containment token in its environment (so a child that left the group is still found)."""
    pidfile = ws / "pids"
    site = _venv(ws / "venv", copies=True)
    _torch(
        site,
        f"open({str(pidfile)!r}, 'w').write("
        "f\"{os.getpid()} {os.getpgid(0)} {int('MM_AGENT_CONTAINED' in os.environ)}\")",
    )
    _report(_call(ws, "check_environment", IMPORTS_TORCH))
    pid, pgid, marked = _pids(pidfile)
    assert pid == pgid and pgid != os.getpgid(0)
    assert marked == 1
