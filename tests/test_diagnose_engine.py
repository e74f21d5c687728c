"""The diagnosis engine on real files: root-cause rules, time order across files, ranks, inputs and garbage.

The first half runs a small controlled catalog (written to tmp) so the engine rules are tested apart from
the shipped data; the second half runs the shipped catalog on realistic cascades.
"""

from __future__ import annotations

import gzip
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_agent.diagnose import DiagnoseRequest, diagnose_errors, diagnose_text, prefilter, scan
from mm_agent.diagnose.catalog import CompiledSignature, load_catalog
from mm_agent.diagnose.ranks import rank_from_path, rank_of_line
from mm_agent.diagnose.rootcause import build_report, fill
from mm_agent.diagnose.stamps import find_stamp
from mm_agent.errors import MMAgentError

# --- a controlled catalog ----------------------------------------------------------------------------

SIGS: list[dict[str, Any]] = [
    {
        "id": "port_busy",
        "category": "master_port_in_use",
        "title": "port {port} is taken {nope}",
        "role": "primary",
        "effect": "fatal",
        "triggers": ["Address already in use"],
        "patterns": [r"bind to \[::\]:(?P<port>\d+) .*Address already in use"],
        "fixes": [
            {"action": "inspect", "text": "see who holds {port}", "command": "ss -ltnp 'sport = :{port}' {"}
        ],
        "match": "The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
    },
    {
        "id": "random_init",
        "category": "checkpoint_not_found",
        "title": "training from random weights",
        "role": "primary",
        "effect": "silent",
        "triggers": ["start from random"],
        "patterns": ["will not load any checkpoints and will start from random"],
        "match": "    will not load any checkpoints and will start from random",
    },
    {
        "id": "peer_timeout",
        "category": "comm_timeout",
        "title": "a peer did not answer",
        "role": "secondary",
        "effect": "fatal",
        "triggers": ["EI0006"],
        "patterns": ["EI0006"],
        "match": "RuntimeError: EI0006: Getting socket times out.",
    },
    {
        "id": "child_failed",
        "category": "unknown",
        "title": "a worker failed",
        "role": "secondary",
        "effect": "fatal",
        "triggers": ["ChildFailedError"],
        "patterns": ["ChildFailedError"],
        "match": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    },
    {
        "id": "cpu_fallback",
        "category": "version_mismatch",
        "title": "an op runs on the CPU",
        "role": "primary",
        "effect": "warning",
        "triggers": ["fall back to run on the CPU"],
        "patterns": ["will fall back to run on the CPU"],
        "match": "Warning: CAUTION: The operator 'aten::x' ... will fall back to run on the CPU.",
    },
    {
        "id": "any_module",
        "category": "missing_dependency",
        "title": "python module {mod} missing",
        "role": "primary",
        "effect": "fatal",
        "generic": True,
        "triggers": [r"No module named '(?P<mod>\w+)"],
        "patterns": [r"No module named '(?P<mod>[\w.]+)'"],
        "match": "ModuleNotFoundError: No module named 'foo'",
    },
    {
        "id": "megatron_mod",
        "category": "missing_dependency",
        "title": "megatron not copied into the checkout",
        "role": "primary",
        "effect": "fatal",
        "triggers": ["No module named '(?P<mod>megatron)"],  # same group name as any_module's trigger
        "patterns": ["No module named 'megatron'"],
        "match": "ModuleNotFoundError: No module named 'megatron'",
    },
    {
        "id": "shouting_bus",
        "category": "shm_bus_error",
        "title": "bus error",
        "role": "primary",
        "effect": "fatal",
        "triggers": ["(?i)bus error"],
        "patterns": ["(?i)bus error"],
        "match": "BUS ERROR",
    },
]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompiledSignature, ...]:
    folder = tmp_path_factory.mktemp("catalog")
    for sig in SIGS:
        data = {k: v for k, v in sig.items() if k != "match"}
        data.setdefault("stage", "any")
        data.setdefault("cause", "because")
        data.setdefault("fixes", [{"action": "retry", "text": "try again"}])
        data["examples"] = {"match": [sig["match"]]}
        (folder / f"{sig['id']}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_catalog(folder)


def write(path: Path, *lines: str, data: bytes | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if data is not None else ("\n".join(lines) + "\n").encode())
    return str(path)


def run(catalog: tuple[CompiledSignature, ...], *paths: str) -> Any:
    return diagnose_errors(DiagnoseRequest(paths=list(paths)), catalog=catalog)


LINES = {sig["id"]: sig["match"] for sig in SIGS}


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        (["child_failed", "peer_timeout", "random_init", "cpu_fallback", "port_busy"], "port_busy"),
        (["child_failed", "peer_timeout", "random_init", "cpu_fallback"], "random_init"),
        (["child_failed", "peer_timeout", "cpu_fallback"], "peer_timeout"),
        (["child_failed", "cpu_fallback"], "child_failed"),
        (["cpu_fallback"], None),
    ],
)
def test_root_cause_tiers(catalog: Any, tmp_path: Path, present: list[str], expected: str | None) -> None:
    """Earliest primary fatal > primary silent > specific secondary > generic wrapper; warnings never."""
    log = write(tmp_path / "train.log", *(LINES[i] for i in present))
    report = run(catalog, log)
    assert {f.rule_id for f in report.findings} == set(present)
    if expected is None:
        assert report.category == "none" and report.root_cause is None
    else:
        assert report.root_cause.rule_id == expected
        assert report.findings[0].rule_id == expected
        assert report.category == report.root_cause.category


def test_named_groups_fill_title_and_fixes(catalog: Any, tmp_path: Path) -> None:
    report = run(catalog, write(tmp_path / "a.log", LINES["port_busy"]))
    root = report.root_cause
    assert root.title == "port 29500 is taken {nope}"  # unknown names stay as written
    assert root.fixes[0].text == "see who holds 29500"
    assert root.fixes[0].command == "ss -ltnp 'sport = :29500' {"
    assert fill("{a} {b} {", {"a": "x"}) == "x {b} {"


def test_generic_signature_only_when_nothing_specific(catalog: Any, tmp_path: Path) -> None:
    log = write(tmp_path / "a.log", LINES["megatron_mod"], "ModuleNotFoundError: No module named 'decord'")
    by_id = {f.rule_id: f for f in run(catalog, log).findings}
    assert by_id["megatron_mod"].evidence[0].line == 1
    assert by_id["any_module"].count == 1 and by_id["any_module"].title == "python module decord missing"


def test_trigger_flags_stay_scoped_in_the_union(catalog: Any, tmp_path: Path) -> None:
    log = write(tmp_path / "a.log", "worker 3: BUS ERROR", "address already in use")  # 2nd: wrong case
    ids = [f.rule_id for f in run(catalog, log).findings]
    assert ids == ["shouting_bus"]


def test_python_re_fallback_gives_the_same_report(
    catalog: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = write(tmp_path / "a.log", *LINES.values(), "BuS eRrOr", "healthy line")
    with_re2 = run(catalog, log)
    monkeypatch.setattr(prefilter, "re2", None)
    without = run(catalog, log)
    assert without.model_dump() == with_re2.model_dump()


def test_time_order_beats_file_order_across_files(catalog: Any, tmp_path: Path) -> None:
    # rank_0 sorts first and its primary comes first in the file, but rank_1's happened earlier.
    first_file = write(
        tmp_path / "logs/rank_0.log",
        "[2026-01-01 12:00:10] ModuleNotFoundError: No module named 'megatron'",
    )
    write(
        tmp_path / "logs/rank_1.log",
        "[2026-01-01 11:59:00] starting",
        "[2026-01-01 12:00:05] The server socket has failed to bind to [::]:6000 (errno: 98 - Address already in use).",
    )
    report = run(catalog, str(Path(first_file).parent))
    assert report.root_cause.rule_id == "port_busy"
    assert report.root_cause.ranks == [1]
    assert report.root_cause.first_seen == "2026-01-01 12:00:05"
    assert [f.rule_id for f in report.findings] == ["port_busy", "megatron_mod"]


def test_hit_line_takes_the_latest_timestamp_before_it(catalog: Any, tmp_path: Path) -> None:
    log = write(
        tmp_path / "a.log",
        "2026-02-03 04:05:06,789 INFO step done",
        "Traceback (most recent call last):",
        "ModuleNotFoundError: No module named 'megatron'",
    )
    assert run(catalog, log).root_cause.first_seen == "2026-02-03 04:05:06.789000"


def test_line_before_the_first_timestamp_takes_the_next_one(catalog: Any, tmp_path: Path) -> None:
    log = write(
        tmp_path / "a.log",
        "ModuleNotFoundError: No module named 'megatron'",
        "2026-02-03 04:05:06,789 INFO shutting down",
    )
    assert run(catalog, log).root_cause.first_seen == "2026-02-03 04:05:06.789000"


def test_glog_stamps_take_the_year_of_the_run(catalog: Any, tmp_path: Path) -> None:
    write(tmp_path / "d/a.log", "[2031-11-22 05:00:00] ModuleNotFoundError: No module named 'megatron'")
    write(tmp_path / "d/b.log", "[rank2]:[E1122 04:59:59.000001 ProcessGroup.cpp:1] EI0006 timeout")
    report = run(catalog, str(tmp_path / "d"))
    timeout = next(f for f in report.findings if f.rule_id == "peer_timeout")
    assert timeout.first_seen == "2031-11-22 04:59:59.000001" and timeout.ranks == [2]


def test_counts_are_complete_evidence_bounded_and_time_ordered(catalog: Any, tmp_path: Path) -> None:
    for rank in range(4):
        lines = [
            f"[2026-01-01 12:00:{59 - rank:02d}] [rank{rank}]: {LINES['peer_timeout']} #{i}"
            for i in range(250)
        ]
        write(tmp_path / f"logs/worker{rank}.log", *lines)
    report = diagnose_errors(DiagnoseRequest(paths=[str(tmp_path / "logs")], max_evidence=3), catalog=catalog)
    f = report.root_cause
    assert f.count == 1000 and f.ranks == [0, 1, 2, 3]
    assert len(f.evidence) == 3
    assert all(e.file.endswith("worker3.log") for e in f.evidence)  # rank 3's lines are the earliest
    assert [e.line for e in f.evidence] == [1, 2, 3]


# --- timestamps and ranks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (" [2026-01-01 12:00:00] iteration 1/ 5000 |", datetime(2026, 1, 1, 12, 0, 0)),
        ("2024-05-06 07:08:09,123 - root - ERROR - x", datetime(2024, 5, 6, 7, 8, 9, 123000)),
        ("[2024-05-06 07:08:09,123] torch.distributed.elastic", datetime(2024, 5, 6, 7, 8, 9, 123000)),
        ("  time      : 2024-05-06_07:08:09", datetime(2024, 5, 6, 7, 8, 9)),
        (
            "[ERROR] HCCL(123,python):2024-05-06-07:08:09.123.456 [a.cc:1]",
            datetime(2024, 5, 6, 7, 8, 9, 123456),
        ),
        ("[rank0]:[E0506 07:08:09.123456 ProcessGroupNCCL.cpp:616]", datetime(2019, 5, 6, 7, 8, 9, 123456)),
        ("no time here 2024-13-45 99:99:99", None),
    ],
)
def test_timestamp_forms(line: str, expected: datetime | None) -> None:
    stamp = find_stamp(line.encode(), 2019)
    assert (stamp.at if stamp else None) == expected


@pytest.mark.parametrize(
    ("path", "rank"),
    [
        ("logs/rank_3.log", 3),
        ("logs/node0_rank12.txt", 12),
        ("run/attempt_0/5/stderr.log", 5),
        ("ascend/log/debug/device-6/device-1234_20260101.log", 6),
        ("logs/rank3/train.log", 3),
        ("ascend/log/debug/plog/plog-1234_20260101.log", None),
        ("logs/frankenstein2.log", None),
        ("/tmp/test_rank3_oom0/logs/train.log", None),
        ("/tmp/test_rank3_oom0/train.log", None),
        ("/runs/rank3/x/y/train.log", None),
        ("job/node1_rank_7/train.log", 7),
    ],
)
def test_rank_from_path(path: str, rank: int | None) -> None:
    assert rank_from_path(path) == rank


@pytest.mark.parametrize(
    ("line", "path_rank", "rank"),
    [
        ("[rank3]: RuntimeError: boom", 0, 3),
        ("[default5]: Traceback", None, 5),
        ("(PID:1, Device:0, RankID:7) ERR02200 DIST call hccl api failed", 1, 7),
        ("  rank      : 4 (local_rank: 4)", 0, 4),
        ("[ERROR] failed (exitcode: 1) local_rank: 5 (pid: 9) of binary: python", 0, 5),
        ("wait socket establish timeout, role[1] rank[2] timeout[120 s]", 6, 6),
        ("wait socket establish timeout, role[1] rank[2] timeout[120 s]", None, 2),
        ("Rank 9 timed out", None, 9),
        ("nothing", None, None),
    ],
)
def test_rank_of_line(line: str, path_rank: int | None, rank: int | None) -> None:
    assert rank_of_line(line, path_rank) == rank


# --- inputs -----------------------------------------------------------------------------------------------


def test_missing_path_and_empty_request_are_user_errors(catalog: Any, tmp_path: Path) -> None:
    with pytest.raises(MMAgentError, match=r"nope\.log: no such file"):
        run(catalog, str(tmp_path / "nope.log"))
    with pytest.raises(MMAgentError, match="nothing to diagnose"):
        diagnose_errors(DiagnoseRequest(), catalog=catalog)


def test_workspace_confinement(catalog: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    outside = write(tmp_path / "secret/rank_0.log", LINES["port_busy"])
    (ws / "logs").mkdir(parents=True)
    (ws / "logs/link.log").symlink_to(outside)
    write(ws / "logs/rank_1.log", LINES["megatron_mod"])
    with pytest.raises(MMAgentError, match="outside the workspace"):
        diagnose_errors(DiagnoseRequest(paths=[outside]), root=ws, catalog=catalog)
    with pytest.raises(MMAgentError, match="outside the workspace"):
        diagnose_errors(DiagnoseRequest(paths=["../secret"]), root=ws, catalog=catalog)
    report = diagnose_errors(DiagnoseRequest(paths=["logs"]), root=ws, catalog=catalog)
    assert report.files == ["logs/rank_1.log"]
    assert report.skipped == ["logs/link.log (links outside the workspace)"]
    assert report.root_cause.rule_id == "megatron_mod"


def test_garbage_never_crashes(catalog: Any, tmp_path: Path) -> None:
    d = tmp_path / "junk"
    write(d / "empty.log", data=b"")
    write(
        d / "model.pt", data=b"PK\x03\x04\x00\x00" + bytes(range(256)) * 100 + LINES["megatron_mod"].encode()
    )
    write(
        d / "bad_utf8.log", data=b"\xff\xfe\xc3(\x80 caf\xe9\n" + LINES["peer_timeout"].encode() + b"\xff\n"
    )
    write(
        d / "ansi_crlf.log",
        data=b"\x1b[31mERROR\x1b[0m: The server socket has failed to bind to [::]:7000 "
        b"(errno: 98 - Address \x1b[1malready\x1b[0m in use).\r\nnext\r\n",
    )
    bars = b"".join(b"\r%3d%%|####      | %d/100" % (i, i) for i in range(0, 100, 5))
    write(d / "bars.log", data=b"loading" + bars + b"\rBUS ERROR in worker\r 100%|##########|\nafter\n")
    long_line = b"x" * 3_000_000 + b" ChildFailedError " + b"y" * 2_000_000
    write(d / "long.log", data=b"first\n" + long_line + b"\nlast ChildFailedError\n")
    report = run(catalog, str(d))
    assert report.skipped == [f"{d}/model.pt (binary)"]
    assert [Path(f).name for f in report.files] == [
        "ansi_crlf.log",
        "bad_utf8.log",
        "bars.log",
        "empty.log",
        "long.log",
    ]
    by_id = {f.rule_id: f for f in report.findings}
    assert by_id["peer_timeout"].evidence[0].line == 2
    assert by_id["peer_timeout"].evidence[0].text.endswith("\\xff")  # not UTF-8: shown as names are
    port = by_id["port_busy"]
    assert port.title == "port 7000 is taken {nope}"
    assert (
        port.evidence[0].text.startswith("ERROR: The server socket") and "\x1b" not in port.evidence[0].text
    )
    bus = by_id["shouting_bus"]
    assert bus.evidence[0].text == "BUS ERROR in worker" and bus.evidence[0].line == 1
    child = by_id["child_failed"]
    assert child.count == 2 and [e.line for e in child.evidence] == [2, 3]
    assert len(child.evidence[0].text) <= 500 and "ChildFailedError" in child.evidence[0].text
    assert any("long.log:2" in n for n in report.notes)
    assert report.lines == 0 + 2 + 2 + 2 + 3  # \r splits lines for matching, not for numbering
    # an explicitly named binary file is read, not skipped
    assert run(catalog, str(d / "model.pt")).root_cause.rule_id == "megatron_mod"


def test_endless_line_is_matched_in_pieces(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than the carry limit (a log with no newline for megabytes) is cut, not held whole."""
    monkeypatch.setattr(scan, "MAX_CARRY", 4096)
    ctx = scan.ScanContext(catalog, 5)
    file_scan = scan.FileScan(ctx, "endless.log", 0, None, 2026)
    for piece in (
        [b"x" * 1500] * 4 + [b" ChildFailedError "] + [b"y" * 1500] * 4 + [b"\nnext ChildFailedError\n"]
    ):
        file_scan.feed(piece)
    file_scan.finish()
    report = build_report(ctx)
    child = report.root_cause
    assert child.count == 2 and [e.line for e in child.evidence] == [1, 2]
    assert report.lines == 2 and report.bytes == 6000 + 18 + 6000 + 23
    assert any("endless.log:1" in n for n in report.notes)


def test_gzip_and_damaged_gzip(catalog: Any, tmp_path: Path) -> None:
    payload = ("\n".join(["noise"] * 50_000 + [LINES["port_busy"]]) + "\n").encode()
    good = tmp_path / "logs/rank_2.log.1.gz"
    good.parent.mkdir()
    good.write_bytes(gzip.compress(payload))
    report = run(catalog, str(good))
    assert report.root_cause.rule_id == "port_busy" and report.root_cause.ranks == [2]
    assert report.root_cause.evidence[0].line == 50_001 and report.bytes == len(payload)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(payload)[:-200])
    damaged = run(catalog, str(cut))
    assert damaged.files == [str(cut)] and any("stopped reading" in n for n in damaged.notes)


def test_text_input(catalog: Any) -> None:
    report = diagnose_errors(DiagnoseRequest(text=LINES["random_init"]), catalog=catalog)
    assert report.files == ["<text>"] and report.root_cause.rule_id == "random_init"


# --- the shipped catalog on realistic runs ---------------------------------------------------------------

ITER = (
    " [2026-01-01 12:00:{s:02d}] iteration {i:8d}/    5000 | consumed samples: {c:12d} | elapsed time per iteration "
    "(ms): {ms:.1f} | learning rate: 1.000000E-05 | global batch size:     8 | loss: {loss} | loss scale: 1.0 | "
    "grad norm: 0.123 | number of skipped iterations:   0 | number of nan iterations: {nan:3d} |"
)


def iterations(n: int, start: int = 1, loss: Any = None, nan: int = 0) -> list[str]:
    out = []
    for i in range(start, start + n):
        value = loss if loss is not None else f"{0.9 - 0.02 * i:.6E}"
        out.append(ITER.format(s=i % 60, i=i, c=8 * i, ms=13000 + i, loss=value, nan=nan))
    return out


def noise(rank: int, minute_second: str, n: int = 5) -> list[str]:
    return [f"[2026-01-01 12:{minute_second},{k:03d}] INFO rank {rank}: loaded batch {k}" for k in range(n)]


def test_rank3_oom_cascade_over_files_plogs_and_launcher(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for rank in range(8):
        lines = noise(rank, "00:00")
        if rank == 3:
            lines += [
                "[2026-01-01 12:00:05] Traceback (most recent call last):",
                "[rank3]: RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 3; 60.96 GiB total capacity;"
                " 57.10 GiB already allocated; 57.10 GiB current active; 1.20 GiB free; 58.00 GiB reserved in total"
                " by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid"
                " fragmentation.",
            ]
        else:
            lines += [
                f"[2026-01-01 12:00:30] [rank{rank}]: RuntimeError: EI0006: Getting socket times out. Reason: Remote"
                " Rank did not send the data in time. Please check the reason for the rank being stuck",
                f"[rank{rank}]: RuntimeError: The Inner error is reported as above. The process exits for this inner"
                " error, and the current working operator name is HcclAllreduce.",
            ]
        write(logs / f"rank_{rank}.log", *lines)
    write(
        logs / "ascend/plog/plog-4101_20260101120000.log",
        "[ERROR] HCCL(4101,python):2026-01-01-12:00:29.900.000 [hccl_socket_manager.cc:797] [4101][Wait]"
        "[LinkEstablish]wait socket establish timeout, role[1] rank[1] timeout[120 s]",
    )
    write(
        logs / "launcher.log",
        "[2026-01-01 12:00:41,000] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1)"
        " local_rank: 3 (pid: 4103) of binary: /usr/bin/python3",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : 1 (pid: 4103)",
    )
    report = diagnose_errors(DiagnoseRequest(paths=[str(logs)]))
    root = report.root_cause
    assert (report.category, root.rule_id, root.ranks) == ("device_oom", "npu_oom", [3])
    assert root.evidence[0].file == f"{logs}/rank_3.log" and root.evidence[0].line == 7
    by_id = {f.rule_id: f for f in report.findings}
    assert by_id["hccl_link_timeout"].ranks == [0, 1, 2, 4, 5, 6, 7]
    assert by_id["hccl_link_timeout"].count == 8  # seven rank logs + the plog
    assert by_id["inner_error_wrapper"].role == "secondary"
    assert by_id["torchrun_child_failed"].first_seen == "2026-01-01 12:00:41"
    assert 3 in by_id["torchrun_child_failed"].ranks
    timed = [f.first_seen for f in report.findings[1:] if f.first_seen]
    assert timed == sorted(timed)


def test_symptoms_first_in_file_order_but_later_in_time(tmp_path: Path) -> None:
    # One combined log where buffered output put the survivors' timeouts above the OOM that caused them.
    log = write(
        tmp_path / "combined.log",
        "[2026-01-01 12:00:30] [rank0]: EI0006: [PID: 1] 2026-01-01-12:00:30.000.000 Getting socket times out."
        " Reason: Remote Rank did not send the data in time. Please check the reason for the rank being stuck",
        "[rank0]: RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly",
        "[2026-01-01 12:00:05] [rank6]: ERROR: Unexpected bus error encountered in worker. This might be caused"
        " by insufficient shared memory (shm).",
    )
    report = diagnose_errors(DiagnoseRequest(paths=[log]))
    assert (report.root_cause.rule_id, report.root_cause.ranks) == ("shm_bus_error", [6])
    assert report.root_cause.first_seen == "2026-01-01 12:00:05"


def test_plog_wrapper_before_the_e_code(tmp_path: Path) -> None:
    home = tmp_path / "ascend/log/debug"
    write(
        home / "plog/plog-3626636_20251121131847.log",
        "[ERROR] HCCL(3626636,python):2025-11-21-13:18:47.700.000 [op_base.cc:1] (PID:3626636, Device:2,"
        " RankID:2) ERR02200 DIST call hccl api failed.",
        "[ERROR] HCCL(3626636,python):2025-11-21-13:18:47.639.860 [hccl_socket.cc:110] [3626636][InitChannelStage]"
        "[RanktableDetect] socket type[2], listen on ip[192.168.1.100%enp53s0f2] and specific port[60000] fail."
        " Please check the port status and whether the port is being used by other process.",
    )
    report = diagnose_errors(DiagnoseRequest(paths=[str(tmp_path / "ascend")]))
    assert report.category == "hccl_port_in_use" and report.root_cause.rule_id == "hccl_host_port_in_use"
    assert "torch_npu_err_wrapper" in {f.rule_id for f in report.findings}


def test_bus_error_then_dataloader_worker_exited(tmp_path: Path) -> None:
    log = write(
        tmp_path / "train.log",
        *iterations(3),
        "[rank1]: ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared"
        " memory (shm).",
        "[rank1]: RuntimeError: DataLoader worker (pid(s) 40211) exited unexpectedly",
    )
    report = diagnose_errors(DiagnoseRequest(paths=[log]))
    assert [f.rule_id for f in report.findings] == ["shm_bus_error", "dataloader_worker_exited"]
    assert report.root_cause.ranks == [1] and report.progress.iteration == 3


def test_libhccl_missing_then_backend_extension(tmp_path: Path) -> None:
    report = diagnose_text(
        "Traceback (most recent call last):\n"
        "ImportError: libhccl.so: cannot open shared object file: No such file or directory\n"
        "The above exception was the direct cause of the following exception:\n"
        "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading"
        " with TORCH_DEVICE_BACKEND_AUTOLOAD=0.\n",
        name="install.log",
    )
    assert report.category == "cann_env" and report.root_cause.rule_id == "libhccl_missing"
    assert report.root_cause.title.startswith("CANN library libhccl.so not found")
    assert report.findings[1].rule_id == "torch_npu_backend_load_failed"
    assert report.root_cause.evidence[0].file == "install.log"


def test_healthy_log_progress(tmp_path: Path) -> None:
    lines = [*iterations(40)]
    lines.insert(20, "saving checkpoint at iteration      20 to ./save in torch format")
    lines.insert(21, "  successfully saved checkpoint from iteration      20 to ./save")
    lines.append("  successfully saved checkpoint from iteration      40 to ./save")
    report = diagnose_errors(DiagnoseRequest(paths=[write(tmp_path / "train.log", *lines)]))
    assert report.category == "none" and report.root_cause is None and report.findings == []
    p = report.progress
    assert (p.iteration, p.total_iterations, p.checkpoints_saved, p.nan_iterations) == (40, 5000, 2, 0)
    assert p.first_loss == pytest.approx(0.88) and p.last_loss == pytest.approx(0.1)
    assert p.loss_trend == "decreasing" and p.step_time_ms == 13040.0
    flat = diagnose_text("\n".join(iterations(10, loss="4.000000E-01")))
    assert flat.progress.loss_trend == "flat"


def test_random_init_is_a_finding_while_training_goes_on(tmp_path: Path) -> None:
    log = write(
        tmp_path / "train.log",
        "WARNING: could not find the metadata file ./weights/transformer/latest_checkpointed_iteration.txt",
        "    will not load any checkpoints and will start from random",
        *iterations(30),
    )
    report = diagnose_errors(DiagnoseRequest(paths=[log]))
    root = report.root_cause
    assert (report.category, root.rule_id, root.effect) == (
        "checkpoint_not_found",
        "ckpt_random_init",
        "silent",
    )
    assert root.count == 2 and report.progress.iteration == 30


def test_nan_loss(tmp_path: Path) -> None:
    lines = iterations(5) + iterations(3, start=6, loss="nan", nan=1) + iterations(2, start=9, nan=2)
    report = diagnose_errors(DiagnoseRequest(paths=[write(tmp_path / "train.log", *lines)]))
    assert report.category == "nan_loss" and report.root_cause.effect == "silent"
    assert report.progress.nan_iterations == 3 + 4 and report.progress.iteration == 10


def test_every_catalog_example_is_found_by_the_streaming_scan(tmp_path: Path) -> None:
    """The block prefilter (RE2 on bytes) must agree with the per-signature Python matching."""
    from mm_agent.diagnose.catalog import get_catalog

    catalog = get_catalog()
    # A rule that `requires` a group from the lines after its hit (reported_error: the `fix:` line) never
    # counts on one line alone; tests/test_diagnose_real_failures.py feeds it whole error/fix blocks.
    # A rule with a context gets a file of its own: each example line after the lines that set its context.
    files: dict[str, list[tuple[str | None, str]]] = {"examples.log": []}
    for e in catalog:
        if e.sig.requires:
            continue
        into = files.setdefault(f"{e.sig.id}.log", []) if e.sig.context else files["examples.log"]
        for line in e.sig.examples.match:
            into += [(None, before) for before in e.sig.examples.context] + [(e.sig.id, line)]
    paths = [write(tmp_path / name, *(line for _, line in lines)) for name, lines in files.items()]
    report = diagnose_errors(DiagnoseRequest(paths=paths, max_evidence=100))
    found: dict[tuple[str, int], set[str]] = {}
    for f in report.findings:
        for ev in f.evidence:
            found.setdefault((Path(ev.file).name, ev.line), set()).add(f.rule_id)
    generic = {e.sig.id for e in catalog if e.sig.generic}
    for name, lines in files.items():
        for number, (rule_id, line) in enumerate(lines, 1):
            if rule_id is None:
                continue
            ids = found.get((name, number), set())
            assert rule_id in ids or (rule_id in generic and ids - generic), f"{rule_id}: {line!r} -> {ids}"
