"""Noise is never the root cause, and context decides between an outside kill and the OOM killer (issue 25).

Holes guarded here, each seen to fail before its fix:
  * healthy multi-node runs (Volcano, AscendJob, pdsh) that ended normally were diagnosed as a fatal
    `missing_dependency`: torch's IPv6 notice "The IPv6 network addresses of (host, port) cannot be retrieved
    (gai error: -2 - Name or service not known)" hit network_unreachable's "Name or service not known"
    (and "Temporary failure in name resolution" for gai error -3);
  * a real HCCL link-setup timeout (EI0006, wrong HCCL_SOCKET_IFNAME) was outranked by that notice;
  * a rank SIGKILLed alone while loading its checkpoint was a kill "from outside", with no word of the OOM
    killer that most likely sent it;
  * a run whose loss went NaN and that was then stopped with Ctrl-C or scancel was diagnosed as the stop.

The healthy corpus is tests/fixtures/healthy_logs/ (its README says how each log was made): real bundled
runs of every launcher, and stock-format MindSpeed-MM logs with the noise multi-node runs print.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mm_agent.diagnose import DiagnoseRequest, DiagnosisReport, diagnose_errors
from mm_agent.diagnose.catalog import load_catalog
from mm_agent.errors import MMAgentError

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "healthy_logs"
LOGS = sorted(p.name for p in CORPUS.glob("*.log"))
# <origin>_<launcher>_<runtime>...: every launcher, real bundled runs and stock MindSpeed-MM logs
KINDS = {
    ("real", "demo", "bundled"),
    ("real", "twohost", "bundled"),
    ("real", "pdsh", "bundled"),
    ("real", "volcano", "bundled"),
    ("real", "ascendjob", "bundled"),
    ("stock", "torchrun", "mindspeed-mm"),
    ("stock", "pdsh", "mindspeed-mm"),
    ("stock", "volcano", "mindspeed-mm"),
    ("stock", "ascendjob", "mindspeed-mm"),
}

IPV6 = [
    "[W socket.cpp:697] [c10d] The IPv6 network addresses of (node-0, 6000) cannot be retrieved "
    "(gai error: -2 - Name or service not known).",
    "[W socket.cpp:697] [c10d] The IPv6 network addresses of (node-0, 6000) cannot be retrieved "
    "(gai error: -3 - Temporary failure in name resolution).",
]


def diagnose(text: str) -> DiagnosisReport:
    return diagnose_errors(DiagnoseRequest(text=text))


def ids(report: DiagnosisReport) -> set[str]:
    return {f.rule_id for f in report.findings}


# --- the healthy corpus ----------------------------------------------------------------------------------


def test_the_corpus_has_every_kind_of_healthy_log() -> None:
    kinds = {tuple(Path(name).stem.split("_")[:3]) for name in LOGS}
    assert kinds >= KINDS, f"missing: {sorted(KINDS - kinds)}"
    assert (CORPUS / "README.md").is_file()


@pytest.mark.parametrize("name", LOGS)
def test_a_healthy_log_has_no_root_cause(name: str) -> None:
    report = diagnose_errors(DiagnoseRequest(paths=[str(CORPUS / name)]))
    assert (report.category, report.root_cause) == ("none", None), report.root_cause
    failures = [f.rule_id for f in report.findings if f.effect in ("fatal", "silent")]
    assert not failures, f"{name}: {failures}"
    if report.progress.iteration is not None:  # the runs went to their end, and the diagnosis saw it
        assert report.progress.iteration == report.progress.total_iterations


def test_the_whole_corpus_at_once_has_no_root_cause() -> None:
    """As users pass all of a job's logs: every file, in time order, still healthy."""
    report = diagnose_errors(DiagnoseRequest(paths=[str(CORPUS / name) for name in LOGS]))
    assert report.category == "none" and report.root_cause is None
    assert len(report.files) == len(LOGS)
    noise = {f.rule_id for f in report.findings if f.effect == "noise"}
    assert {"noise_c10d_ipv6", "noise_pg_not_destroyed", "noise_tbe_exit"} <= noise
    assert {"noise_leaked_semaphore", "noise_stock_script_awk"} <= noise
    assert all(f.category == "none" for f in report.findings if f.effect == "noise")


@pytest.mark.parametrize("line", IPV6)
def test_the_ipv6_notice_is_not_a_missing_dependency(line: str) -> None:
    report = diagnose(line + "\n")
    assert report.category == "none" and "network_unreachable" not in ids(report)
    assert report.findings[0].rule_id == "noise_c10d_ipv6" and report.findings[0].effect == "noise"


def test_a_real_name_resolution_failure_is_still_one() -> None:
    """The noise rule takes only the notice line: a download that cannot resolve its host is still fatal."""
    line = "fatal: unable to access 'https://gitcode.com/Ascend/MindSpeed-MM.git/': Could not resolve host: gitcode.com"
    assert diagnose("\n".join([*IPV6, line]) + "\n").category == "missing_dependency"


# --- noise and warnings never outrank a failure ------------------------------------------------------------

HCCL_IFNAME = [
    *IPV6,
    "building SoRA model ...",
    "[rank8]: Traceback (most recent call last):",
    '[rank8]:   File "/home/MindSpeed-MM/pretrain_sora.py", line 231, in <module>',
    "[rank8]: RuntimeError: create:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:191 HCCL function error: "
    "hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is 7",
    "[rank8]: [ERROR] 2026-11-20-09:22:41 (PID:2301, Device:0, RankID:8) ERR02200 DIST call hccl api failed.",
    "[rank8]: EI0006: [PID: 2301] 2026-11-20-09:22:41.444.436 Getting socket times out. Reason: Remote Rank did "
    "not send the data in time. Please check the reason for the rank being stuck",
    "[ERROR] HCCL(2301,python):2026-11-20-09:22:41.113.403 [hccl_socket_manager.cc:797] [2301][Wait][LinkEstablish]"
    "wait socket establish timeout, role[1] rank[8] timeout[1200 s]",
]


def test_an_hccl_link_timeout_outranks_the_ipv6_notice() -> None:
    report = diagnose("\n".join(HCCL_IFNAME) + "\n")
    assert report.category == "comm_timeout", [f.rule_id for f in report.findings]
    assert report.root_cause is not None and report.root_cause.rule_id == "hccl_link_timeout"
    assert "HCCL_SOCKET_IFNAME" in report.root_cause.env_vars
    assert "network_unreachable" not in ids(report)


def test_noise_and_warnings_alone_are_healthy_and_never_outrank_a_fatal() -> None:
    warning = (
        "[W compiler_depend.ts:51] Warning: CAUTION: The operator 'aten::_foreach_norm' is not currently "
        "supported on the NPU backend and will fall back to run on the CPU. This may have performance implications."
    )
    fatal = "[rank0]: ModuleNotFoundError: No module named 'decord'"
    exit_noise = "[ERROR] TBE Subprocess[task_distribute] raise error[], main process disappeared!"
    quiet = diagnose("\n".join([*IPV6, warning, exit_noise]) + "\n")
    assert quiet.category == "none" and {f.effect for f in quiet.findings} == {"noise", "warning"}
    loud = diagnose("\n".join([*IPV6, warning, fatal, exit_noise]) + "\n")
    assert loud.root_cause is not None and loud.root_cause.rule_id == "decord_missing"


ITERATION = (
    " iteration {i:8d}/      10 | consumed samples:            {i} | elapsed time per iteration (ms): 1000.0 |"
    " learning rate: 1.000000E-05 | global batch size:     1 | lm loss: 1.000000E-01 | loss scale: 1.0 |"
    " grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)
SKIPPED = (  # MindSpeed-MM's T2VDataset.__getitem__ prints the error and takes another sample
    "Data /data/clips/0001.mp4: the error is [Errno 2] No such file or directory: '/data/clips/0001.mp4'"
)


def test_a_skipped_sample_is_not_the_failure_of_a_run_that_went_on() -> None:
    """The quoted error (a missing video) matched video_file_missing, a fatal primary cause: a healthy run
    that skipped one sample was diagnosed as stopped by it."""
    report = diagnose("\n".join([ITERATION.format(i=1), SKIPPED, ITERATION.format(i=2)]) + "\n")
    assert report.category == "none", [f.rule_id for f in report.findings]
    assert ids(report) == {"data_sample_skipped"}


def test_a_missing_video_that_stops_the_run_is_still_the_cause() -> None:
    line = "FileNotFoundError: [Errno 2] No such file or directory: '/data/clips/0001.mp4'"
    report = diagnose("\n".join([SKIPPED, line]) + "\n")
    assert report.root_cause is not None and report.root_cause.rule_id == "video_file_missing"


# --- context: SIGKILL while loading, a stop after a failure ----------------------------------------------

SENDING = (
    "W1120 09:02:10.000000 281473046564880 torch/distributed/elastic/multiprocessing/api.py:897] "
    "Sending process {pid} closing signal SIGTERM"
)
TORCHRUN_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/usr/local/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 919, in main',
    "    run(args)",
    '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 269, in launch_agent',
    "    raise ChildFailedError(",
]


def torchrun_failure(code: int, signal: str) -> list[str]:
    """torchrun's end when rank 0 (PID 2345) died of `signal` and it closed the others itself."""
    return [
        *(SENDING.format(pid=pid) for pid in range(2346, 2353)),
        "E1120 09:02:11.000000 281473046564880 torch/distributed/elastic/multiprocessing/api.py:869] "
        f"failed (exitcode: {code}) local_rank: 0 (pid: 2345) of binary: /usr/bin/python3",
        *TORCHRUN_TRACEBACK,
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=======================================================",
        "pretrain_sora.py FAILED",
        "-------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "-------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-20_09:02:10",
        "  host      : node-0",
        "  rank      : 0 (local_rank: 0)",
        f"  exitcode  : {code} (pid: 2345)",
        "  error_file: <N/A>",
        f"  traceback : Signal {-code} ({signal}) received by PID 2345",
        "=======================================================",
    ]


LOADING = [
    "time to initialize megatron (seconds): 41.772",
    "[after megatron is initialized] datetime: 2026-11-20 09:00:43 ",
    "building SoRA model ...",
    " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 14288491584",
    " loading release checkpoint from /data/ckpt/wan2.1_14b_t2v_mm",
]


def iteration(i: int, loss: str = "1.302114E-01", nan: int = 0) -> str:
    return (
        f" [2026-11-20 09:{i + 2:02d}:00] iteration {i:8d}/{5000:8d} | consumed samples: {16 * i:12d} | "
        f"elapsed time per iteration (ms): 30123.4 | learning rate: 1.000000E-05 | global batch size:    16 | "
        f"loss: {loss} | loss scale: 1.0 | grad norm: {'nan' if nan else '0.812'} | "
        f"number of skipped iterations:   0 | number of nan iterations: {nan:3d} |"
    )


OOM_CHECK = "dmesg -T | grep -i -E 'killed process|out of memory'"


def test_a_sigkill_while_loading_is_most_likely_the_oom_killer() -> None:
    report = diagnose("\n".join([*LOADING, *torchrun_failure(-9, "SIGKILL")]) + "\n")
    assert report.category == "host_oom", [f.rule_id for f in report.findings]
    root = report.root_cause
    assert root is not None and root.rule_id == "host_oom_suspected" and "most likely" in root.title
    assert root.fixes[0].command == OOM_CHECK
    assert "killed_by_signal" not in ids(report)


@pytest.mark.parametrize(
    ("before", "line"),
    [
        (
            [
                "building VLMModel ...",
                "Loading checkpoint shards:  50%|█████     | 2/4 [00:41<00:41, 20.61s/it]",
            ],
            "subprocess.CalledProcessError: Command '['/usr/bin/python3', '-u', 'pretrain_vlm.py']' died with "
            "<Signals.SIGKILL: 9>.",
        ),
        (["> building GPT model ..."], "  exitcode  : -9 (pid: 4100)"),
    ],
    ids=["hf-shards-died-with", "building-model-exitcode"],
)
def test_other_sigkill_forms_while_loading(before: list[str], line: str) -> None:
    assert diagnose("\n".join([*before, line]) + "\n").category == "host_oom"


def test_a_sigkill_while_loading_with_a_scheduler_line_is_a_stop() -> None:
    cancel = "slurmstepd: error: *** JOB 4242 ON node-0 CANCELLED AT 2026-11-20T09:02:10 ***"
    report = diagnose("\n".join([*LOADING, cancel, *torchrun_failure(-9, "SIGKILL")]) + "\n")
    assert report.category == "killed_by_signal" and report.root_cause is not None
    assert report.root_cause.rule_id == "job_cancelled"


def test_a_plain_outside_kill_stays_killed_by_signal() -> None:
    """A SIGKILL mid-training (the loading was over) with nothing failed before it."""
    text = [*LOADING, "training ...", *(iteration(i) for i in range(1, 6)), *torchrun_failure(-9, "SIGKILL")]
    report = diagnose("\n".join(text) + "\n")
    assert report.category == "killed_by_signal" and report.root_cause is not None
    assert report.root_cause.rule_id == "killed_by_signal"
    assert "host_oom" not in {f.category for f in report.findings}
    sigterm = "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3003 got signal: 15"
    assert diagnose("\n".join([iteration(1), sigterm]) + "\n").category == "killed_by_signal"


CTRL_C = [
    "^CW1120 09:20:00.112000 281473046564880 torch/distributed/elastic/agent/server/api.py:704] Received "
    "Signals.SIGINT death signal, shutting down workers",
    "W1120 09:20:00.113000 281473046564880 torch/distributed/elastic/multiprocessing/api.py:897] "
    "Sending process 2345 closing signal SIGINT",
    "[rank0]: Traceback (most recent call last):",
    '[rank0]:   File "/home/MindSpeed-MM/pretrain_sora.py", line 231, in <module>',
    "[rank0]: KeyboardInterrupt",
    *TORCHRUN_TRACEBACK,
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2300 got signal: 2",
]
SCANCEL = [
    "slurmstepd: error: *** JOB 4242 ON node-0 CANCELLED AT 2026-11-20T09:20:00 ***",
    "W1120 09:20:00.112000 281473046564880 torch/distributed/elastic/agent/server/api.py:704] Received "
    "Signals.SIGTERM death signal, shutting down workers",
    "W1120 09:20:00.113000 281473046564880 torch/distributed/elastic/multiprocessing/api.py:897] "
    "Sending process 2345 closing signal SIGTERM",
    *TORCHRUN_TRACEBACK,
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2300 got signal: 15",
]
NAN_RUN = [iteration(1), iteration(2), iteration(3, "nan", 1), iteration(4, "nan", 1), iteration(5, "nan", 1)]


@pytest.mark.parametrize("stop", [CTRL_C, SCANCEL], ids=["ctrl-c", "scancel"])
def test_nan_loss_then_a_stop_is_nan_loss(stop: list[str]) -> None:
    report = diagnose("\n".join([*NAN_RUN, *stop]) + "\n")
    assert report.category == "nan_loss", [f.rule_id for f in report.findings]
    assert report.root_cause is not None and report.root_cause.effect == "silent"
    assert {f.category for f in report.findings} >= {"nan_loss", "killed_by_signal"}  # the stop is listed


@pytest.mark.parametrize("stop", [CTRL_C, SCANCEL], ids=["ctrl-c", "scancel"])
def test_a_stop_of_a_healthy_run_is_a_stop(stop: list[str]) -> None:
    report = diagnose("\n".join([iteration(1), iteration(2), *stop]) + "\n")
    assert report.category == "killed_by_signal" and report.root_cause is not None
    assert report.root_cause.rule_id == "job_cancelled"


# --- the new catalog fields are validated -----------------------------------------------------------------

BASE = {
    "id": "boom_rule",
    "category": "device_fault",
    "title": "t",
    "stage": "any",
    "role": "primary",
    "effect": "fatal",
    "triggers": ["boom"],
    "patterns": ["boom"],
    "cause": "c",
    "fixes": [{"action": "inspect", "text": "look"}],
    "examples": {"match": ["boom"]},
}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"category": "none"}, "noise"),
        ({"effect": "noise"}, "noise"),
        ({"yields_to_earlier": ["warning"]}, "yields_to_earlier.0"),
        ({"context": {"during": ["loading"]}}, "examples.context"),
        (
            {"context": {"during": ["loading("]}, "examples": {"match": ["boom"], "context": ["x"]}},
            "context.during.0",
        ),
        (
            {"context": {"lines": 0, "during": ["x"]}, "examples": {"match": ["boom"], "context": ["x"]}},
            "lines",
        ),
        ({"examples": {"match": ["boom"], "out_of_context": ["x"]}}, "context"),
        ({"handled": True}, "handled"),
    ],
    ids=[
        "none-not-noise",
        "noise-not-none",
        "earlier-warning",
        "no-context-examples",
        "bad-context-regex",
        "zero-lines",
        "context-examples-without-context",
        "handled-fatal",
    ],
)
def test_bad_context_fields_name_the_file_and_field(
    tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    path = tmp_path / "boom_rule.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}), encoding="utf-8")
    with pytest.raises(MMAgentError) as info:
        load_catalog(tmp_path)
    assert info.value.file == str(path) and info.value.fix
    assert field in f"{info.value.field} {info.value.message}"
