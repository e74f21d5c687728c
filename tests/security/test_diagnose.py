"""diagnose_errors and validate_configs read only what they should, and always finish (issue 12, items 3, 4, 6).

Holes guarded here, each seen to fail before its fix:
  * a FIFO given to diagnose_errors (or reached by validate_configs) blocked the call forever, and 40 such
    calls exhausted the server's worker threads; a socket or a device (/dev/zero) was opened too;
  * a parent swapped for a symlink between the check and the open leaked a file from outside;
  * a small gzip that expands to gigabytes was read to its end;
  * a tree a thousand levels deep raised RecursionError, and symlink loops were silently dropped or crashed
    validate_configs, instead of an error or a note with the fix;
  * a full disk was diagnosed as a failed worker or a dead peer, a manual SIGKILL as the host OOM killer.

Calls that used to hang or to read without end run in a fresh interpreter with a memory cap and a generous
timeout as a hang guard (an uncapped read of /dev/zero would otherwise eat the machine's memory).
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mm_agent.diagnose import DiagnoseRequest, diagnose_errors, reader
from mm_agent.diagnose.catalog import get_catalog
from mm_agent.diagnose.reader import collect, read_source
from mm_agent.diagnose.rootcause import build_report
from mm_agent.diagnose.scan import ScanContext
from mm_agent.errors import MMAgentError
from mm_agent.fields import LOG_TEXT_CHARS, MAX_PATHS
from mm_agent.validate import ValidateRequest, validate_configs
from mm_agent.validate import job as validate_job
from security.common import run_python

HANG_GUARD_S = 60
MEMORY_CAP = 1 << 30  # bytes of address space for an isolated call

SECRET = "TOPSECRET"
SECRET_LINE = f"ModuleNotFoundError: No module named '{SECRET}'"
MODULE_LINE = "ModuleNotFoundError: No module named 'einops'"

_PRELUDE = f"""
import json, resource
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP}))
from mm_agent.errors import MMAgentError
from mm_agent.diagnose import DiagnoseRequest, diagnose_errors
from mm_agent.validate import ValidateRequest, validate_configs

def call(fn):
    try:
        return {{"report": json.loads(fn().model_dump_json())}}
    except MMAgentError as exc:
        return {{"error": exc.message, "fix": exc.fix}}
"""


def isolated(body: str) -> dict[str, Any]:
    """Run `body` (which sets `out`) in a fresh, memory-capped interpreter under the hang guard."""
    code = _PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    stdout = run_python(code, HANG_GUARD_S, "the call (it blocks or reads without end)")
    result: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    return result


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with one ordinary log in logs/."""
    root = tmp_path / "ws"
    (root / "logs").mkdir(parents=True)
    (root / "logs/rank_0.log").write_text(MODULE_LINE + "\n", encoding="utf-8")
    return root


# --- FIFOs, sockets, devices: refused before any open ------------------------------------------------


def test_diagnose_refuses_a_named_fifo_instead_of_blocking(ws: Path) -> None:
    os.mkfifo(ws / "logs/pipe.log")
    out = isolated(
        f"out = call(lambda: diagnose_errors(DiagnoseRequest(paths=['logs/pipe.log']), root=Path({str(ws)!r})))"
    )
    assert "FIFO" in out["error"] and out["fix"]


def test_diagnose_skips_a_fifo_in_a_walked_directory(ws: Path) -> None:
    os.mkfifo(ws / "logs/rank_1.log")
    out = isolated(
        f"out = call(lambda: diagnose_errors(DiagnoseRequest(paths=['logs']), root=Path({str(ws)!r})))"
    )
    report = out["report"]
    assert report["files"] == ["logs/rank_0.log"]
    assert any(s.startswith("logs/rank_1.log (a FIFO") for s in report["skipped"]), report["skipped"]
    assert report["root_cause"]["rule_id"] == "python_module_missing"


def test_diagnose_refuses_a_socket(ws: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(ws / "logs/agent.sock"))
        with pytest.raises(MMAgentError, match="a socket") as info:
            diagnose_errors(DiagnoseRequest(paths=["logs/agent.sock"]), root=ws)
        assert info.value.fix
        report = diagnose_errors(DiagnoseRequest(paths=["logs"]), root=ws)
        assert any(s.startswith("logs/agent.sock (a socket") for s in report.skipped), report.skipped
    finally:
        sock.close()


def test_diagnose_refuses_a_device_instead_of_reading_it_forever() -> None:
    out = isolated("out = call(lambda: diagnose_errors(DiagnoseRequest(paths=['/dev/zero'])))")
    assert "character device" in out["error"] and out["fix"]


def _job_with(directory: Path, make: Callable[[Path], None]) -> Path:
    job = directory / "job"
    job.mkdir(parents=True)
    (job / "data.json").write_text('{"dataset_param": {"dataset_type": "feature"}}\n', encoding="utf-8")
    make(job)
    return job


def test_validate_reports_a_fifo_script_instead_of_blocking(tmp_path: Path) -> None:
    job = _job_with(tmp_path / "ws", lambda j: os.mkfifo(j / "finetune.sh"))
    out = isolated(
        f"out = call(lambda: validate_configs(ValidateRequest(paths=['job']), root=Path({str(job.parent)!r})))"
    )
    found = [f for f in out["report"]["findings"] if f["file"].endswith("finetune.sh")]
    assert [f["rule"] for f in found] == ["file.unreadable"] and "FIFO" in found[0]["message"]
    assert found[0]["fix"]


def test_validate_reports_a_named_fifo_config(tmp_path: Path) -> None:
    job = _job_with(tmp_path / "ws", lambda j: os.mkfifo(j / "model.json"))
    out = isolated(
        f"out = call(lambda: validate_configs(ValidateRequest(paths=['job/model.json']), "
        f"root=Path({str(job.parent)!r})))"
    )
    assert [(f["rule"], "FIFO" in f["message"]) for f in out["report"]["findings"]] == [
        ("file.unreadable", True)
    ]


def test_validate_refuses_a_script_that_is_a_device(tmp_path: Path) -> None:
    job = _job_with(tmp_path, lambda j: (j / "finetune.sh").symlink_to("/dev/zero"))
    out = isolated(f"out = call(lambda: validate_configs(ValidateRequest(paths=[{str(job)!r}])))")
    found = [f for f in out["report"]["findings"] if f["file"] == "/dev/zero"]
    assert [f["rule"] for f in found] == ["file.unreadable"] and "device" in found[0]["message"]


def test_forty_fifo_calls_leave_the_server_answering(ws: Path) -> None:
    """40 diagnose_errors calls on a FIFO used to take every worker thread for good; now each is refused
    at once and the server still answers the next call."""
    os.mkfifo(ws / "logs/pipe.log")
    out = isolated(
        f"""
        import anyio
        from mcp import Client
        from mm_agent.server import build_server

        async def go():
            async with Client(build_server(Path({str(ws)!r}))) as client:
                results = [None] * 40
                async def one(i):
                    results[i] = await client.call_tool("diagnose_errors", {{"paths": ["logs/pipe.log"]}})
                async with anyio.create_task_group() as tg:
                    for i in range(40):
                        tg.start_soon(one, i)
                after = await client.call_tool("diagnose_errors", {{"paths": ["logs/rank_0.log"]}})
                return [(r.is_error, r.content[0].text) for r in results], after.is_error

        fifo, after_error = anyio.run(go)
        out = {{"fifo": fifo, "after_error": after_error}}
        """
    )
    assert len(out["fifo"]) == 40
    assert all(is_error and "FIFO" in text and "fix:" in text for is_error, text in out["fifo"])
    assert out["after_error"] is False


# --- a parent swapped for a symlink between the check and the open ---------------------------------


def _swap_for_link(directory: Path, target: Path) -> None:
    directory.rename(directory.with_name(directory.name + ".orig"))
    directory.symlink_to(target, target_is_directory=True)


def test_diagnose_swap_after_the_check_leaks_nothing(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank_0.log").write_text(SECRET_LINE + "\n", encoding="utf-8")
    sources, _ = collect(["logs/rank_0.log"], ws.resolve())  # confined: inside the workspace
    _swap_for_link(ws / "logs", outside)  # the race: the parent now leads outside
    ctx = ScanContext(get_catalog(), 5)
    with pytest.raises(MMAgentError, match="outside") as info:
        read_source(ctx, sources[0], 0)
    assert info.value.fix
    assert SECRET not in build_report(ctx).model_dump_json()


def test_diagnose_swap_in_a_walked_tree_leaks_nothing(ws: Path, tmp_path: Path) -> None:
    (ws / "logs/rank1").mkdir()
    (ws / "logs/rank1/train.log").write_text(MODULE_LINE + "\n", encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "train.log").write_text(SECRET_LINE + "\n", encoding="utf-8")
    sources, _ = collect(["logs"], ws.resolve())
    _swap_for_link(ws / "logs/rank1", outside)
    ctx = ScanContext(get_catalog(), 5)
    for index, source in enumerate(sources):
        read_source(ctx, source, index)
    report = build_report(ctx)
    assert report.files == ["logs/rank_0.log"]
    assert [s.split(" ")[0] for s in report.skipped] == ["logs/rank1/train.log"]
    assert SECRET not in "".join(e.text for f in report.findings for e in f.evidence)


def test_validate_swap_after_the_check_leaks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    (ws / "job/conf").mkdir(parents=True)
    (ws / "job/conf/model.json").write_text('{"predictor": {"model_id": "wandit"}}\n', encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.json").write_text(json.dumps({"predictor": {"model_id": SECRET}}), encoding="utf-8")
    real_load = validate_job.load_config
    read: list[str] = []

    def swap_then_load(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name == "model.json" and not (ws / "job/conf").is_symlink():
            _swap_for_link(ws / "job/conf", outside)  # after the path was resolved and checked
        cfg = real_load(path, *args, **kwargs)
        read.append(cfg.text if cfg is not None else "")
        return cfg

    monkeypatch.setattr(validate_job, "load_config", swap_then_load)
    report = validate_configs(ValidateRequest(paths=["job"]), root=ws)
    assert read and not any(SECRET in text for text in read)
    refused = [f for f in report.findings if f.rule == "file.unreadable"]
    assert refused and "outside" in refused[0].message and refused[0].fix


# --- decompression cap ----------------------------------------------------------------------------


def test_a_gzip_bomb_is_read_only_up_to_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = 1 << 20
    monkeypatch.setattr(reader, "MAX_DECOMPRESSED", cap, raising=False)  # the real cap is 512 MiB
    bomb = tmp_path / "rank_0.log.1.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (64 << 20) + b"\n" + MODULE_LINE.encode() + b"\n"))
    report = diagnose_errors(DiagnoseRequest(paths=[str(bomb)]))
    assert report.bytes == cap
    assert report.root_cause is None  # the line after the cap was never read
    assert any("stopped after 1 MiB decompressed" in note for note in report.notes), report.notes


# --- deep trees and symlink loops: an answer with the fix, never a traceback -----------------------


def _remove_tree(top: Path) -> None:
    """Remove a tree one directory at a time: shutil.rmtree (and so pytest's own clean-up of old temp
    dirs) recurses, and would fail on the tree below for every later test session."""
    stack = [top]
    while stack:
        with os.scandir(stack[-1]) as entries:
            subdirs = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        if subdirs:
            stack += subdirs
            continue
        directory = stack.pop()
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()


@pytest.fixture
def deep_tree(ws: Path) -> Iterator[Path]:
    """logs/d/d/.../d, 1200 levels, with a log at the bottom (Python's recursion limit is 1000)."""
    top = ws / "logs/d"
    fd = os.open(ws / "logs", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1200):  # one level at a time: Path.mkdir(parents=True) itself recurses
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        log = os.open("rank_9.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(log, (SECRET_LINE + "\n").encode())
        os.close(log)
    finally:
        os.close(fd)
    try:
        yield top
    finally:
        _remove_tree(top)


def test_a_very_deep_tree_is_walked_to_the_depth_cap(ws: Path, deep_tree: Path) -> None:
    report = diagnose_errors(DiagnoseRequest(paths=["logs"]), root=ws)
    assert report.files == ["logs/rank_0.log"]
    assert len(report.skipped) == 1 and "deeper than 64 levels" in report.skipped[0]
    assert "pass it as a path of its own" in report.skipped[0]


def test_a_symlink_loop_in_a_walk_is_named_with_the_fix(ws: Path) -> None:
    (ws / "logs/loop.log").symlink_to("loop.log")
    report = diagnose_errors(DiagnoseRequest(paths=["logs"]), root=ws)
    assert report.files == ["logs/rank_0.log"]
    assert report.skipped == ["logs/loop.log (symlink loop: remove or repoint the link)"]


def test_a_named_symlink_loop_is_an_error_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "loop.log").symlink_to("loop.log")
    with pytest.raises(MMAgentError, match="symbolic links") as info:
        diagnose_errors(DiagnoseRequest(paths=[str(tmp_path / "loop.log")]))
    assert info.value.fix and "symlink" in info.value.fix


def test_validate_names_a_symlink_loop_instead_of_crashing(tmp_path: Path) -> None:
    job = _job_with(tmp_path, lambda j: (j / "loop.json").symlink_to("loop.json"))
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=tmp_path)
    found = [f for f in report.findings if f.file.endswith("loop.json")]
    assert [f.rule for f in found] == ["file.unreadable"] and "symlink loop" in found[0].message
    assert "symlink" in found[0].fix


# --- full disk and signals in the catalog ---------------------------------------------------------

TORCHRUN_SUMMARY = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "  time      : 2026-01-01_12:00:41",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : {code} (pid: 4100)",
]


def _write_run(logs: Path, rank0: list[str], code: str, extra: tuple[str, ...] = ()) -> Path:
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "rank_0.log").write_text("\n".join(rank0) + "\n", encoding="utf-8")
    (logs / "rank_1.log").write_text(
        "[2026-01-01 12:00:30] [rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [10.0.0.2]:23456\n",
        encoding="utf-8",
    )
    summary = [line.format(code=code) for line in TORCHRUN_SUMMARY]
    (logs / "launcher.log").write_text("\n".join([*summary, *extra]) + "\n", encoding="utf-8")
    return logs


def test_a_full_disk_is_the_root_cause_not_the_failed_worker_or_dead_peer(tmp_path: Path) -> None:
    logs = _write_run(
        tmp_path / "logs",
        [
            "[2026-01-01 12:00:20] saving checkpoint at iteration     500 to /data/save/wan in torch format",
            "[2026-01-01 12:00:21] OSError: [Errno 28] No space left on device: "
            "'/data/save/wan/iter_0000500/mp_rank_00/model_optim_rng.pt'",
        ],
        "1",
    )
    report = diagnose_errors(DiagnoseRequest(paths=[str(logs)]))
    assert report.category == "disk_full" and report.root_cause is not None
    assert report.root_cause.rule_id == "disk_full" and report.root_cause.role == "primary"
    assert any("save_path" in fix.text for fix in report.root_cause.fixes)


def test_torch_save_on_a_full_disk_is_a_full_disk() -> None:
    text = (
        "RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 1284502272 vs 1284502160\n"
        "  exitcode  : 1 (pid: 4100)\n"
    )
    assert diagnose_errors(DiagnoseRequest(text=text)).category == "disk_full"


def test_a_plain_sigkill_is_not_the_oom_killer(tmp_path: Path) -> None:
    logs = _write_run(
        tmp_path / "logs",
        ["[2026-01-01 12:00:10] iteration 10/100 | loss: 1.0 |"],
        "-9",
        ("  traceback : Signal 9 (SIGKILL) received by PID 4100",),
    )
    report = diagnose_errors(DiagnoseRequest(paths=[str(logs)]))
    assert report.category == "killed_by_signal"
    assert "host_oom" not in {f.category for f in report.findings}


def test_a_sigterm_from_a_scheduler_is_a_signal_kill() -> None:
    text = "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3003 got signal: 15\n"
    assert diagnose_errors(DiagnoseRequest(text=text)).category == "killed_by_signal"


TORCHRUN_CLOSES_SIBLINGS = """\
error: something unexpected broke
W1125 06:12:27.612000 32382 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 32387 closing signal SIGTERM
E1125 06:12:27.613000 32382 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 32386) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_06:12:27
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 32387)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 32387
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_06:12:27
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 32386)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchrun_closing_the_other_ranks_is_not_a_kill_from_outside() -> None:
    """torchrun SIGTERMs the surviving ranks itself after one fails; those -15 lines name no outside
    sender, so the failed rank stays the root cause (this fired the watchdog on every ordinary failure)."""
    report = diagnose_errors(DiagnoseRequest(text=TORCHRUN_CLOSES_SIBLINGS))
    assert report.category != "killed_by_signal"
    assert "killed_by_signal" not in {f.category for f in report.findings}


def test_sigkill_with_kernel_oom_evidence_is_the_oom_killer(tmp_path: Path) -> None:
    logs = _write_run(tmp_path / "logs", ["[2026-01-01 12:00:10] iteration 10/100 | loss: 1.0 |"], "-9")
    (logs / "dmesg.txt").write_text(
        "[Thu Jan  1 12:00:40 2026] Out of memory: Killed process 4100 (python) total-vm:812345678kB, "
        "anon-rss:501234567kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:987654kB oom_score_adj:0\n",
        encoding="utf-8",
    )
    report = diagnose_errors(DiagnoseRequest(paths=[str(logs)]))
    assert report.category == "host_oom"


# --- request bounds -------------------------------------------------------------------------------


def test_diagnose_request_is_bounded() -> None:
    with pytest.raises(ValidationError, match=str(MAX_PATHS)):
        DiagnoseRequest(paths=["a.log"] * (MAX_PATHS + 1))
    with pytest.raises(ValidationError, match=str(LOG_TEXT_CHARS)):
        DiagnoseRequest(text="x" * (LOG_TEXT_CHARS + 1))
    with pytest.raises(ValidationError, match="control character"):
        DiagnoseRequest(paths=["logs/a.log\nrm -rf ~"])


def test_validate_request_is_bounded() -> None:
    with pytest.raises(ValidationError, match=str(MAX_PATHS)):
        ValidateRequest(paths=["job"] * (MAX_PATHS + 1))
    with pytest.raises(ValidationError, match="control character"):
        ValidateRequest(paths=["job"], mm_root="/opt/mm\n")
