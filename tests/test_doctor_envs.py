"""Which environment `mm-agent doctor` judges, and whose runs it blames (issue 29, item 6).

On the machine where mm-agent is installed, the doctor judged mm-agent's own venv (torch 2.13.0 for the bundled
runtime) as MindSpeed-MM's training environment and told the user to `pip install torch==2.7.1` into it; and its
stale-process check pointed at a run of another workspace that shares the user's state directory. Real venvs
(`python -m venv --without-pip`) stand in for training environments, a real `torchrun` script on PATH for the
one a MindSpeed-MM job's scripts run, and a real background run (`runs.start_run`) for the other workspace's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_agent.doctor import DoctorReport, DoctorRequest, check_environment
from mm_agent.doctor.models import CheckResult
from mm_agent.jobs import list_jobs, stop_job
from mm_agent.runs import RunInfo, runs_dir, start_run

ENV_CHECKS = ["python_version", "torch_version", "base_deps", "model_deps", "decord", "megatron_path"]
MM_TORCH = "2.7.1"  # MindSpeed-MM 26.0.0's torch (registry versions.yaml)


@pytest.fixture(autouse=True)
def no_training_env_around(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `torchrun` on PATH, no activated env, no MM_ROOT, state and cwd in tmp: only what a test sets up."""
    path = [
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "torchrun").exists()
    ]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX", "MM_ROOT", "PYTHONPATH", "PYTHON"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


def venv(where: Path, torch: str | None = None) -> Path:
    """A real venv (no pip) with, optionally, torch's installed-distribution record; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    if torch is not None:
        site = next((where / "lib").glob("python3*/site-packages"))
        info = site / f"torch-{torch}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch}\n")
    return where / "bin" / "python"


def torchrun(folder: Path, python: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `torchrun` console script as pip writes it (its shebang names its env's python), first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "torchrun"
    script.write_text(f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return script


PIP_SH = """#!/bin/sh
'''exec' "{python}" "$0" "$@"
' '''
import sys
import time
from torch.distributed.run import main
sys.exit(main())
"""


def doctor(
    *checks: str, root: Path | None = None, **fields: object
) -> tuple[DoctorReport, dict[str, CheckResult]]:
    report = check_environment(DoctorRequest(checks=list(checks), **fields), root)  # type: ignore[arg-type]
    return report, {c.id: c for c in report.checks}


def no_change_to_own_env(results: dict[str, CheckResult]) -> None:
    """No fix asks to install into, or uninstall from, the interpreter mm-agent runs in."""
    for c in results.values():
        fix = c.fix or ""
        assert not fix.startswith(("pip install", "pip uninstall")), c
        assert f"pip install torch=={MM_TORCH}" not in fix or "separate" in fix, c


# ---------------------------------------------------------------------------------------------------------
# which environment is judged


def test_mm_agents_own_venv_is_not_judged_as_the_training_env() -> None:
    """No interpreter named, no torchrun on PATH: mm-agent's own venv (no MindSpeed-MM in it) is not taken for
    the training env; the report says where mm-agent runs and that no training env was judged."""
    report, results = doctor(*ENV_CHECKS, model="wan2.1")
    lead = results["python_version"]
    assert lead.status == "warn" and "no MindSpeed-MM training environment" in lead.summary, lead
    assert lead.fix and "--python" in lead.fix
    assert any(sys.executable in e and "mm-agent runs in" in e for e in lead.evidence), lead.evidence
    for cid in ("torch_version", "base_deps", "model_deps", "decord"):
        assert results[cid].status == "skip" and "see python_version" in results[cid].summary, results[cid]
    no_change_to_own_env(results)
    assert report.machine.agent_python == sys.executable
    assert "no training environment" in report.machine.python_source


def test_torchrun_on_path_names_the_training_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A MindSpeed-MM job's scripts run `torchrun` from PATH: the env its shebang names is the one judged, and
    each check that judged it says so."""
    python = venv(tmp_path / "mm-env", torch=MM_TORCH)
    torchrun(tmp_path / "mm-env" / "bin", str(python), monkeypatch)
    report, results = doctor("python_version", "torch_version", "decord")
    torch = results["torch_version"]
    assert torch.status == "fail" and f"torch {MM_TORCH} is installed but torch_npu is not" in torch.summary
    assert report.machine.python_executable == str(python)
    assert "torchrun" in report.machine.python_source and report.machine.agent_python == sys.executable
    for c in results.values():
        assert any(str(python) in e for e in c.evidence), c  # the judged interpreter, named


def test_torchrun_of_mm_agents_own_env_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mm-agent's venv activated: its torchrun is first on PATH; that is mm-agent's env, not a training one."""
    torchrun(tmp_path / "agent-bin", sys.executable, monkeypatch)
    _, results = doctor(*ENV_CHECKS)
    lead = results["python_version"]
    assert lead.status == "warn" and "no MindSpeed-MM training environment" in lead.summary, lead
    assert any("torchrun" in e and "mm-agent's own" in e for e in lead.evidence), lead.evidence
    no_change_to_own_env(results)


def test_pips_sh_form_of_torchrun_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip writes `#!/bin/sh` + an `exec` line when the env's path has a space (or is too long for `#!`)."""
    python = venv(tmp_path / "my envs" / "mm", torch=MM_TORCH)
    script = torchrun(tmp_path / "bin", str(python), monkeypatch)
    script.write_text(PIP_SH.format(python=python))
    report, _ = doctor("torch_version")
    assert report.machine.python_executable == str(python), report.machine


def test_mm_agent_installed_into_the_training_env_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mm-agent installed into the MindSpeed-MM env (mindspeed_mm is there): that env is judged, and still no
    fix installs into it (mm-agent runs in it)."""
    site = tmp_path / "site"
    info = site / "mindspeed_mm-26.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mindspeed_mm\nVersion: 26.0.0\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    report, results = doctor(*ENV_CHECKS)
    assert "has MindSpeed-MM installed" in report.machine.python_source, report.machine
    assert results["torch_version"].status == "fail", results["torch_version"]
    no_change_to_own_env(results)


def test_the_checkout_venv_is_the_training_env(tmp_path: Path) -> None:
    """No torchrun on PATH: the MindSpeed-MM checkout's own .venv is the environment to judge."""
    root = tmp_path / "MindSpeed-MM"
    (root / "mindspeed_mm").mkdir(parents=True)
    python = venv(root / ".venv", torch="2.1.0")
    report, results = doctor("torch_version", mm_root=str(root))
    assert report.machine.python_executable == str(python)
    assert "checkout" in report.machine.python_source
    torch = results["torch_version"]
    assert torch.status == "fail" and "torch 2.1.0" in torch.summary, torch
    assert torch.fix and torch.fix.startswith(f"pip install torch=={MM_TORCH}")  # into that env: fine


def test_named_own_interpreter_is_judged_but_never_changed() -> None:
    """--python naming mm-agent's own interpreter for a MindSpeed-MM run: judged, as asked, but every fix
    sends the MindSpeed-MM pins to an environment of their own, never into mm-agent's."""
    report, results = doctor(*ENV_CHECKS, model="wan2.1", python=sys.executable)
    torch = results["torch_version"]
    assert torch.status == "fail" and torch.fix, torch
    assert "mm-agent itself runs in" in torch.fix and "--python" in torch.fix
    no_change_to_own_env(results)
    assert "--python" in report.machine.python_source and "mm-agent's own" in report.machine.python_source


def test_over_mcp_an_env_outside_the_workspace_is_named_not_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served over MCP, the training env that PATH's torchrun names lies outside the workspace: named, and the
    fix says how to have it judged; mm-agent's own env is not judged in its place."""
    python = venv(tmp_path / "outside-env", torch=MM_TORCH)
    torchrun(tmp_path / "outside-env" / "bin", str(python), monkeypatch)
    ws = tmp_path / "ws"
    ws.mkdir()
    report, results = doctor(*ENV_CHECKS, root=ws)
    lead = results["python_version"]
    assert lead.status == "warn" and str(python) in lead.summary and "outside" in lead.summary, lead
    assert lead.fix and "python" in lead.fix
    assert report.machine.python_executable != sys.executable
    no_change_to_own_env(results)


# ---------------------------------------------------------------------------------------------------------
# whose runs the stale-process check looks at

WORKER = "import time\ntime.sleep(120)\n"


@pytest.fixture
def other_run(tmp_path: Path) -> Iterator[tuple[RunInfo, Path]]:
    """A training-like run (`python pretrain_fake.py RUN_DIR`) started by the server of another workspace,
    recorded in the state directory every workspace of this user shares; stopped at the end."""
    other = tmp_path / "other-ws"
    other.mkdir()
    scripts = tmp_path / "scripts"  # (not in the workspace: the command line must not name it)
    scripts.mkdir()
    (scripts / "pretrain_fake.py").write_text(WORKER)
    argv = [sys.executable, str(scripts / "pretrain_fake.py")]
    info = start_run("fake", argv, DoctorRequest(), other, workspace=other)
    yield info, other
    if runs_dir().is_dir():
        for run in list_jobs().jobs:
            if run.state == "running":
                stop_job(run.run_id, confirm=True, timeout_s=5)


def _line(check: CheckResult, pid: int) -> str:
    lines = [e for e in check.evidence if f"PID {pid} " in e]
    assert len(lines) == 1, check
    return lines[0]


def test_another_workspaces_run_is_named_not_blamed(tmp_path: Path, other_run: tuple[RunInfo, Path]) -> None:
    info, other = other_run
    ws = tmp_path / "ws"
    ws.mkdir()
    _, results = doctor("stale_processes", root=ws)
    stale = results["stale_processes"]
    line = _line(stale, info.pid)
    assert f"run {info.run_id} " in line and f"workspace {other.resolve()}" in line, line
    assert "not this workspace's" in line, line
    assert f"stop {info.pid}" not in (stale.fix or "") and info.run_id not in (stale.fix or ""), stale

    # the server of that workspace: its own leftover, with the run's stop
    _, results = doctor("stale_processes", root=other)
    own = results["stale_processes"]
    assert own.status == "warn" and f"run {info.run_id} " in _line(own, info.pid)
    assert own.fix and f"mm-agent stop {info.run_id}" in own.fix

    # the CLI sees every run: it names whose it is
    _, results = doctor("stale_processes")
    cli = results["stale_processes"]
    line = _line(cli, info.pid)
    assert cli.status == "warn" and f"run {info.run_id} " in line and f"workspace {other.resolve()}" in line


LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
    "open(sys.argv[1], 'w').write(str(s.getsockname()[1]))\n"
    "time.sleep(120)\n"
)


def test_a_port_held_by_another_workspaces_run_is_named_not_offered_to_stop(tmp_path: Path) -> None:
    """The port checks (here MASTER_PORT) say whose run holds the port instead of offering this workspace's
    server a stop of another workspace's run; that workspace's own doctor offers its run's stop."""
    other = tmp_path / "other-ws"
    other.mkdir()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "pretrain_listen.py").write_text(LISTENER)
    port_file = tmp_path / "port"
    info = start_run(
        "fake",
        [sys.executable, str(scripts / "pretrain_listen.py"), str(port_file)],
        DoctorRequest(),
        other,
        workspace=other,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text():
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.1)
        port = int(port_file.read_text())
        ws = tmp_path / "ws"
        ws.mkdir()
        _, results = doctor("master_port", root=ws, master_port=port)
        check = results["master_port"]
        assert check.status == "fail", check
        assert f"belongs to run {info.run_id} of workspace {other.resolve()}, not this workspace's" in (
            check.fix or ""
        ), check
        assert "mm-agent stop" not in (check.fix or ""), check

        _, results = doctor("master_port", root=other, master_port=port)
        own = results["master_port"]
        assert own.status == "fail" and f"mm-agent stop {info.run_id}" in (own.fix or ""), own
    finally:
        stop_job(info.run_id, confirm=True, timeout_s=5)
