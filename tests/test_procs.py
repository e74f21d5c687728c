"""Process safety with real processes: who holds a port, and `stop` acting only on mm-agent's own processes
(checked by PID, create_time and command line), never on anyone else's or on a recycled PID."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from mm_agent import procs
from mm_agent.cli import main
from mm_agent.errors import MMAgentError
from mm_agent.procs import ProcRecord, StopRequest, stop_process

LISTENER = (
    "import socket, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(120)\n"
)
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(path))
    return path


def own_listener(started: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], int]:
    proc = procs.spawn([sys.executable, "-c", LISTENER], purpose="test listener", stdout=subprocess.PIPE)
    started.append(proc)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def foreign_listener(started: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE)
    started.append(proc)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_port_holders_name_both_and_only_offer_stop_for_ours(started: list[subprocess.Popen[bytes]]) -> None:
    own, own_port = own_listener(started)
    other, other_port = foreign_listener(started)
    listeners = procs.listening_ports()
    assert not procs.port_free(own_port, listeners=listeners)
    assert not procs.port_free(other_port, listeners=listeners)

    [mine] = procs.port_holders(own_port)
    assert mine.pid == own.pid and mine.started_by_mm_agent and mine.purpose == "test listener"
    assert mine.cmdline == [sys.executable, "-c", LISTENER]
    assert f"mm-agent stop {own.pid}" in mine.stop_hint

    [theirs] = procs.port_holders(other_port)
    assert theirs.pid == other.pid and not theirs.started_by_mm_agent
    assert theirs.user == psutil.Process().username()
    assert f"kill {other.pid}" in theirs.stop_hint and "mm-agent stop" not in theirs.stop_hint
    assert "-c" in theirs.stop_hint  # names the command line

    other.kill()
    other.wait(timeout=10)
    assert procs.port_free(other_port)


def test_stop_refuses_a_process_mm_agent_did_not_start(started: list[subprocess.Popen[bytes]]) -> None:
    other, _ = foreign_listener(started)
    with pytest.raises(MMAgentError) as err:
        stop_process(StopRequest(pid=other.pid, confirm=True))
    assert "not started by mm-agent" in err.value.message
    assert err.value.fix is not None and str(other.pid) in err.value.fix and "socket" in err.value.fix
    assert other.poll() is None, "a foreign process must never be signalled"


def test_dry_run_then_confirm_stops_ours_and_removes_the_record(
    started: list[subprocess.Popen[bytes]], state_dir: Path
) -> None:
    own, port = own_listener(started)
    records = list((state_dir / "procs").glob("*.json"))
    assert len(records) == 1
    saved = json.loads(records[0].read_text())
    assert saved["pid"] == own.pid and saved["purpose"] == "test listener" and saved["create_time"] > 0

    dry = stop_process(StopRequest(pid=own.pid))
    assert dry.status == "dry_run" and dry.targets == [own.pid] and "SIGTERM" in dry.message
    assert own.poll() is None and records[0].exists()
    assert [p.pid for p in procs.list_processes().processes] == [own.pid]

    done = stop_process(StopRequest(pid=own.pid, confirm=True, timeout_s=5))
    assert done.status == "stopped" and done.killed == []
    own.wait(timeout=5)
    assert not psutil.pid_exists(own.pid)
    assert not any((state_dir / "procs").glob("*.json"))
    assert procs.port_free(port)
    assert stop_process(StopRequest(pid=own.pid, confirm=True)).status == "not_running"  # idempotent


def test_stop_signals_children_and_kills_after_the_timeout(started: list[subprocess.Popen[bytes]]) -> None:
    own = procs.spawn([sys.executable, "-c", STUBBORN], purpose="ignores SIGTERM", stdout=subprocess.PIPE)
    started.append(own)
    assert own.stdout is not None
    child = int(own.stdout.readline())
    result = stop_process(StopRequest(pid=own.pid, confirm=True, timeout_s=0.5))
    assert result.status == "stopped"
    assert set(result.targets) == {own.pid, child}
    assert set(result.killed) == {own.pid, child}  # both ignore SIGTERM (SIG_IGN is inherited)
    own.wait(timeout=5)
    assert not psutil.pid_exists(own.pid)
    assert ended(child)


def ended(pid: int) -> bool:
    """Whether `pid` exits (or is left a zombie for init to reap) within 5 s."""
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE:
            proc.wait(timeout=5)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True


@pytest.mark.parametrize("tamper", ["create_time", "cmdline"])
def test_recycled_pid_is_refused(
    started: list[subprocess.Popen[bytes]], state_dir: Path, tamper: str
) -> None:
    other, _ = foreign_listener(started)
    live = psutil.Process(other.pid)
    rec = ProcRecord(
        pid=other.pid,
        create_time=live.create_time() - 1000 if tamper == "create_time" else live.create_time(),
        cmdline=live.cmdline() if tamper == "create_time" else ["python", "train.py"],
        purpose="an older process that had this PID",
        started_at="2020-01-01T00:00:00+00:00",
        user="someone",
    )
    procs._write_record(rec)
    with pytest.raises(MMAgentError) as err:
        stop_process(StopRequest(pid=other.pid, confirm=True))
    assert ("PID was reused" if tamper == "create_time" else "command line changed") in err.value.message
    assert other.poll() is None
    assert not any((state_dir / "procs").glob("*.json")), "the stale record is pruned"


def test_records_of_dead_processes_are_pruned(state_dir: Path) -> None:
    proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(0.2)"], purpose="short")
    assert any((state_dir / "procs").glob("*.json"))
    proc.wait(timeout=10)
    assert procs.live_records() == {}
    assert not any((state_dir / "procs").glob("*.json"))


def test_stale_training_processes_finds_entry_scripts(
    started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    script = tmp_path / "pretrain_sora.py"
    script.write_text("import time\ntime.sleep(120)\n")
    run = subprocess.Popen([sys.executable, str(script), "--mm-data", "x.json"])
    started.append(run)
    found = {p.pid: p for p in procs.stale_training_processes()}
    assert run.pid in found
    assert found[run.pid].cmdline[1] == str(script) and not found[run.pid].started_by_mm_agent


@pytest.mark.parametrize(
    ("cmdline", "training"),
    [
        (["torchrun", "--nproc_per_node", "8", "pretrain_sora.py"], True),
        (["/usr/bin/python3", "-m", "torch.distributed.run", "x.py"], True),
        (["python", "-u", "inference_vlm.py"], True),
        (["python3.10", "mindspeed_mm/tools/feature_extraction/get_wan_feature.py"], True),
        (["python", "-c", "import pretrain_sora"], False),
        (["grep", "mindspeed"], False),
        (["python", "train.py", "--mm-root", "/data/MindSpeed-MM"], False),
        ([], False),
    ],
)
def test_is_training_command(cmdline: list[str], training: bool) -> None:
    assert procs.is_training_command(cmdline) is training


def test_cli_stop_and_ps(started: list[subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]) -> None:
    own, _ = own_listener(started)
    other, _ = foreign_listener(started)
    assert main(["ps", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["pid"] for p in listed["processes"]] == [own.pid]

    assert main(["stop", str(own.pid), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "dry_run"
    assert own.poll() is None

    assert main(["stop", str(other.pid)]) == 2
    err = capsys.readouterr().err
    assert "not started by mm-agent" in err and f"kill {other.pid}" in err and "Traceback" not in err
    assert other.poll() is None

    assert main(["stop", str(own.pid), "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "stopped"
    own.wait(timeout=5)
    assert not psutil.pid_exists(own.pid)


def test_spawn_refuses_shell_strings() -> None:
    with pytest.raises(MMAgentError):
        procs.spawn([], purpose="nothing")
    with pytest.raises(MMAgentError):
        procs.spawn("echo hi", purpose="a shell string")  # type: ignore[arg-type]
