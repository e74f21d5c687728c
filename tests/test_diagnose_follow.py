"""`--follow` on logs written by real subprocesses while the diagnosis runs.

No timing is asserted (latency is measured in benchmarks/diagnose_throughput.py). What is checked is that
the follower stops on its own while the writer is still alive (so it did not wait for the log to end),
with the right root cause, and that Ctrl-C, timeouts, new files, stdin and truncation behave.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from mm_agent.diagnose import follow

REPO = Path(__file__).resolve().parent.parent
ITER = (
    " [2026-01-01 12:00:{s:02d}] iteration {i:8d}/    5000 | consumed samples: {c:12d} | elapsed time per iteration "
    "(ms): 13707.5 | learning rate: 1.000000E-05 | global batch size:     8 | loss: {loss:.6E} | loss scale: 1.0 |"
    " grad norm: 0.123 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)
BUS = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."
WORKER_EXITED = "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly"

# Appends (delay, line) steps to a file (or stdout for "-"), flushing each, then lingers so a test can see
# that the follower returned before the writer ended. "TRUNCATE" empties the file.
WRITER = r"""
import json, sys, time
path, steps, linger = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
out = sys.stdout if path == "-" else open(path, "a")
for delay, text in steps:
    time.sleep(delay)
    if text == "TRUNCATE":
        out.close(); out = open(path, "w"); continue
    out.write(text + "\n"); out.flush()
time.sleep(linger)
"""


def healthy(n: int, start: int = 1) -> list[str]:
    return [ITER.format(s=i % 60, i=i, c=8 * i, loss=0.5 - 0.01 * i) for i in range(start, start + n)]


def writer(
    path: str, steps: list[tuple[float, str]], linger: float = 60, **kw: object
) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WRITER, path, json.dumps(steps), str(linger)], **kw)  # type: ignore[call-overload]


def diagnose(*args: str, **kw: object) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "mm_agent", "diagnose", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a writer this test started (by its own handle)."""
    proc.kill()
    proc.wait()


def test_reports_the_fatal_line_while_the_log_still_grows(tmp_path: Path) -> None:
    log = tmp_path / "rank_4.log"
    log.write_text("\n".join(healthy(3)) + "\n")
    steps = [(0.1, line) for line in healthy(8, start=4)] + [(0.2, BUS)]
    w = writer(str(log), steps)
    try:
        rc, out, err = finish(diagnose(str(log), "--follow", "--json", "--timeout", "50"))
        assert w.poll() is None, "the follower waited for the writer to finish"
    finally:
        stop(w)
    assert rc == 1, err
    report = json.loads(out)
    root = report["root_cause"]
    assert (root["rule_id"], root["ranks"]) == ("shm_bus_error", [4])
    assert root["evidence"][0]["line"] == 12
    assert report["progress"]["iteration"] == 11 and report["progress"]["loss_trend"] == "decreasing"
    assert "follow: stopped at the first fatal root cause" in report["notes"]


def test_new_file_in_a_followed_directory(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank_0.log").write_text("\n".join(healthy(5)) + "\n")
    (logs / "core.bin").write_bytes(b"\x7fELF\x00\x00" + BUS.encode())
    w = writer(str(logs / "rank_3.log"), [(0.6, "[rank3]: starting"), (0.3, BUS)])
    try:
        rc, out, err = finish(diagnose(str(logs), "--follow", "--json", "--timeout", "50"))
        assert w.poll() is None
    finally:
        stop(w)
    assert rc == 1, err
    report = json.loads(out)
    assert report["root_cause"]["ranks"] == [3]
    assert report["files"] == [f"{logs}/rank_0.log", f"{logs}/rank_3.log"]
    assert report["skipped"] == [f"{logs}/core.bin (binary)"]


def test_a_symptom_alone_is_reported_after_the_grace(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    w = writer(str(log), [(0.3, WORKER_EXITED)])
    try:
        rc, out, err = finish(diagnose(str(tmp_path), "--follow", "--json", "--timeout", "50"))
        assert w.poll() is None
    finally:
        stop(w)
    assert rc == 1, err
    report = json.loads(out)
    assert report["root_cause"]["rule_id"] == "dataloader_worker_exited"
    assert any("after a fatal symptom" in n for n in report["notes"])


def test_a_cause_arriving_within_the_grace_wins(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    w = writer(str(log), [(0.3, WORKER_EXITED), (0.3, BUS)])
    try:
        report = follow([str(log)], grace=30, timeout=50)
        assert w.poll() is None
    finally:
        stop(w)
    assert report.root_cause is not None and report.root_cause.rule_id == "shm_bus_error"
    assert [f.rule_id for f in report.findings] == ["shm_bus_error", "dataloader_worker_exited"]


def test_timeout_on_a_healthy_log(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(healthy(20)) + "\n")
    rc, out, err = finish(diagnose(str(log), "--follow", "--json", "--timeout", "0.5"))
    assert rc == 0, err
    report = json.loads(out)
    assert report["category"] == "none" and report["progress"]["iteration"] == 20
    assert report["notes"] == ["follow: stopped after the 0.5 s timeout"]


def test_ctrl_c_prints_the_summary_so_far(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(healthy(7)) + "\n")
    proc = diagnose(str(log), "--follow")
    assert proc.stderr is not None
    assert "following 1 input(s)" in proc.stderr.readline()  # printed once the file was read
    proc.send_signal(signal.SIGINT)
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert "no failure found" in out and "progress: iteration 7/5000" in out
    assert "interrupted" in out


def test_stdin_is_followed_until_the_cause_appears(tmp_path: Path) -> None:
    w = writer("-", [(0.1, line) for line in healthy(5)] + [(0.2, BUS)], stdout=subprocess.PIPE)
    try:
        rc, out, err = finish(diagnose("-", "--follow", "--json", stdin=w.stdout))
        assert w.poll() is None
    finally:
        stop(w)
    assert rc == 1, err
    report = json.loads(out)
    assert report["files"] == ["<stdin>"] and report["root_cause"]["evidence"][0]["line"] == 6


def test_stdin_end_ends_the_follow() -> None:
    proc = diagnose("-", "--follow", "--json", stdin=subprocess.PIPE)
    out, err = proc.communicate("\n".join(healthy(4)) + "\n", timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["notes"] == ["follow: every input has ended"]


def test_truncated_file_is_read_again(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(healthy(30)) + "\n")
    w = writer(str(log), [(0.8, "TRUNCATE"), (0.1, "fresh start"), (0.1, BUS)])
    try:
        report = follow([str(log)], timeout=50)
    finally:
        stop(w)
    assert report.root_cause is not None and report.root_cause.evidence[0].line == 2
    assert any("truncated or replaced" in n for n in report.notes)


def test_timeout_without_follow_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("x\n")
    rc, _, err = finish(diagnose(str(log), "--timeout", "5"))
    assert rc == 2 and "--timeout only applies with --follow" in err
