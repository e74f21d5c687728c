"""Job management with real processes: rendered jobs whose stage scripts run a real torchrun (2 workers of
`fixtures/job_worker.py`, which prints contract C2's lines without importing torch), started, followed,
watchdogged and stopped through `mm_agent.jobs`, the CLI and the MCP server.

The jobs are rendered by `render_job` (bundled runtime) so job.yaml, feature_data.json and the input checks
are the real ones; only the stage script is replaced by one with the same header (PYTHON, NPUS_PER_NODE,
MASTER_PORT taken from the environment, LOAD_PATH, MM_DATA) that launches the stand-in worker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import Client, StdioServerParameters

from mm_agent.cli import main
from mm_agent.diagnose import DiagnoseRequest, diagnose_errors
from mm_agent.errors import MMAgentError
from mm_agent.jobs import (
    JobStatus,
    StageRequest,
    job_status,
    list_jobs,
    start_stage,
    stop_job,
    tail_logs,
    wait_job,
)
from mm_agent.jobs.ports import HCCL_BASE, HCCL_SPAN, pick_hccl_base
from mm_agent.jobs.progress import ProgressParser
from mm_agent.jobs.schema import STAGE_FILE, StageRecord
from mm_agent.jobs.status import redact
from mm_agent.render import RenderRequest, render_job
from mm_agent.runs import runs_dir
from mm_agent.server import build_server

WORKER = Path(__file__).resolve().parent / "fixtures" / "job_worker.py"
DEADLINE_S = 120.0  # guard against a hung wait; never reached when the code works


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_job(ws: Path, name: str = "job", *, master_port: int = 6000) -> Path:
    """A rendered bundled Wan2.1 job with its inputs in place: dataset index, features, converted checkpoint."""
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            out_dir=name,
            npus_per_node=2,
            tp=1,
            pp=1,
            cp=1,
            master_port=master_port,
            weights_dir="weights",
            load_path=f"{name}-ckpt",
            dataset_dir="dataset",
            runtime="bundled",
            confirm=True,
        ),
        root=ws,
    )
    job = ws / name
    (ws / "dataset").mkdir(exist_ok=True)
    (ws / "dataset" / "data.json").write_text("[]")
    (job / "sora_features").mkdir()
    (job / "sora_features" / "data.jsonl").write_text("")
    (ws / f"{name}-ckpt").mkdir()
    (ws / f"{name}-ckpt" / "latest_checkpointed_iteration.txt").write_text("release")
    return job


def stand_in(job: Path, rel: str, mode: str, iters: int = 5, pause: float = 0.2) -> Path:
    """Replace a stage script with one launching the worker under torchrun; returns the PID folder."""
    pids = job / f"pids-{mode}"
    pids.mkdir(exist_ok=True)
    script = job / rel
    rendered = re.search(r"MASTER_PORT=\$\{MASTER_PORT:-(\d+)\}", script.read_text())
    assert rendered is not None, "the rendered script takes MASTER_PORT from the environment"
    load = shlex.quote(str(job.parent / f"{job.name}-ckpt"))
    script.write_text(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        'JOB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        f"PYTHON=${{PYTHON:-{shlex.quote(sys.executable)}}}\n"
        "NPUS_PER_NODE=${NPUS_PER_NODE:-2}\n"
        f"MASTER_PORT=${{MASTER_PORT:-{rendered.group(1)}}}\n"
        'MM_DATA="$JOB_DIR/feature_data.json"\n'
        f"LOAD_PATH={load}\n"
        '"$PYTHON" -m torch.distributed.run --nproc_per_node "$NPUS_PER_NODE" --master_port "$MASTER_PORT" '
        f"{shlex.quote(str(WORKER))} {mode} {shlex.quote(str(pids))} {iters} {pause}\n"
    )
    return pids


def workers(pids: Path, count: int = 2) -> list[tuple[int, int]]:
    """(PID, MASTER_PORT) of every worker, once all have started."""
    end = time.monotonic() + DEADLINE_S
    while len(list(pids.glob("rank*.pid"))) < count:
        assert time.monotonic() < end, "workers did not start"
        time.sleep(0.1)
    time.sleep(0.1)  # the file is written in one call; give it a moment to be complete
    out = []
    for f in sorted(pids.glob("rank*.pid")):
        pid, port = f.read_text().split()
        out.append((int(pid), int(port)))
    return out


def stage_pids(run_id: str) -> list[int]:
    record = StageRecord.model_validate_json((runs_dir() / run_id / STAGE_FILE).read_text())
    return [p.pid for p in record.processes]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def until(run_id: str, check: str) -> JobStatus:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        status = job_status(run_id)
        if check == "iteration" and (status.iteration or 0) >= 2:
            return status
        if status.state != "running":
            return status
        time.sleep(0.1)
    pytest.fail(f"run {run_id} did not reach {check}")


# ---------------------------------------------------------------------------------------------------------
# checks before anything starts


def test_dry_run_starts_nothing_and_avoids_a_held_port(ws: Path) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        job = make_job(ws, master_port=port)
        stand_in(job, "pretrain.sh", "train")
        plan = start_stage(StageRequest(job_dir="job", stage="train"))
    assert plan.status == "dry_run" and plan.run_id is None and plan.runtime == "bundled"
    assert plan.master_port is not None and plan.master_port > port
    assert plan.env["MASTER_PORT"] == str(plan.master_port)
    assert plan.argv == ["bash", str(job / "pretrain.sh")] and plan.nproc_per_node == 2
    assert str(job / "sora_features" / "data.jsonl") in plan.checked
    assert str(ws / "job-ckpt") in plan.checked
    assert "confirm=true" in plan.message
    assert not runs_dir().exists(), "a dry run must not record anything"

    nproc = start_stage(StageRequest(job_dir=str(job), stage="train", nproc_per_node=1))
    assert nproc.env["NPUS_PER_NODE"] == "1" and nproc.nproc_per_node == 1


def test_refusals_name_the_file_and_the_fix(ws: Path) -> None:
    (ws / "empty").mkdir()
    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="empty", stage="train"))
    assert err.value.file == str(ws / "empty" / "job.yaml") and "mm-agent render" in (err.value.fix or "")

    job = make_job(ws)
    (job / "job.yaml").write_text("model: [wan2.1\n")
    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="job", stage="train"))
    assert err.value.file == str(job / "job.yaml")

    job = make_job(ws, "job2")
    (job / "sora_features" / "data.jsonl").unlink()
    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="job2", stage="train"))
    assert "extracted features are missing" in err.value.message
    assert err.value.fix == f"extract them first: mm-agent extract {job} --yes"

    (job / "sora_features" / "data.jsonl").write_text("")
    (ws / "job2-ckpt" / "latest_checkpointed_iteration.txt").unlink()
    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="job2", stage="train"))
    assert err.value.field == "LOAD_PATH" and "random weights" in err.value.message
    assert "mm-agent convert WanConverter hf_to_mm --source weights/transformer" in (err.value.fix or "")

    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="job2", stage="sample"))
    assert "no trained checkpoint" in err.value.message and "mm-agent train" in (err.value.fix or "")
    (job / "checkpoints").mkdir()  # the job's own save_path (per job, not per workspace)
    (job / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5")
    with pytest.raises(MMAgentError) as err:  # inference.sh runs one process, whatever is asked
        start_stage(StageRequest(job_dir="job2", stage="sample", nproc_per_node=2))
    assert err.value.field == "nproc_per_node"

    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="job2", stage="extract", env={"LD_PRELOAD": "/tmp/x.so"}))
    assert err.value.field == "env.LD_PRELOAD"
    extract = start_stage(StageRequest(job_dir="job2", stage="extract", env={"MM_AGENT_DEVICE": "cpu"}))
    assert extract.env["MM_AGENT_DEVICE"] == "cpu" and str(ws / "dataset" / "data.json") in extract.checked

    render_job(
        RenderRequest(model="wan2.1", task="t2v", out_dir="mm", mm_root="MindSpeed-MM", confirm=True), root=ws
    )
    with pytest.raises(MMAgentError) as err:
        start_stage(StageRequest(job_dir="mm", stage="extract"))
    assert err.value.field == "MM_ROOT" and "mm-agent install wan2.1" in (err.value.fix or "")


def test_progress_parser_reads_the_c2_lines() -> None:
    train = ProgressParser("train")
    line = (
        " [2026-11-22 10:00:01] iteration        3/      10 | consumed samples:            6 | elapsed time per "
        "iteration (ms): 250.0 | learning rate: 1.000000E-05 | global batch size:     2 | loss: 4.250000E-01 | "
        "loss scale: 1.0 | grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    assert train.line(" loading release checkpoint from /ckpt") and train.progress.message.startswith(
        "loading"
    )
    assert train.line(line)
    p = train.progress
    assert (p.phase, p.iteration, p.total, p.last_loss, p.step_time_ms, p.eta_s) == (
        "training",
        3,
        10,
        0.425,
        250.0,
        1.75,
    )
    assert train.line(line.replace("4.250000E-01", "nan")) and train.progress.last_loss is None
    assert train.progress.first_loss == 0.425
    train.line("  successfully saved checkpoint from iteration      10 to /save in torch format")
    assert train.progress.checkpoint == "/save"
    assert not train.line("some other line")

    extract = ProgressParser("extract")
    extract.line("Starting feature extraction. Total samples: 8")
    assert (extract.progress.extract_done, extract.progress.extract_total) == (0, 8)
    extract.line("feature extraction progress: 3/8 samples | 1.50 samples/s | ETA 4 s")
    e = extract.progress
    assert (e.phase, e.extract_done, e.extract_total, e.samples_per_s, e.eta_s) == (
        "extracting",
        3,
        8,
        1.5,
        4.0,
    )

    sample = ProgressParser("sample")
    sample.line("saved sample to /job/samples/sample_0.mp4")
    assert sample.progress.outputs == ["/job/samples/sample_0.mp4"]


def test_hccl_ranges_skip_live_jobs_and_held_ports() -> None:
    base = pick_hccl_base([])
    assert base >= HCCL_BASE and (base - HCCL_BASE) % HCCL_SPAN == 0
    assert pick_hccl_base([base]) >= base + HCCL_SPAN  # a live job's range is never shared
    with socket.socket() as held:
        try:
            held.bind(("0.0.0.0", base + 5))
        except OSError:
            pytest.skip(f"port {base + 5} went to another process meanwhile")
        held.listen()
        assert pick_hccl_base([]) >= base + HCCL_SPAN  # one bound port in a range rules it out


def test_log_lines_leave_with_secrets_masked() -> None:
    line = "env HF_TOKEN=hf_abcdefghijklmnopqrstuvwx url https://user:pw@host/x token hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    assert redact(line) == "env HF_TOKEN=*** url https://***@host/x token hf_***"
    assert redact(" iteration 1/ 2 | loss: 1.0 |") == " iteration 1/ 2 | loss: 1.0 |"


# ---------------------------------------------------------------------------------------------------------
# real runs


@pytest.mark.slow
def test_training_reports_iteration_loss_eta_then_succeeds(ws: Path) -> None:
    job = make_job(ws)
    pids = stand_in(job, "pretrain.sh", "train", iters=6, pause=0.4)
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True))
    assert launch.status == "started" and launch.run_id and launch.pgid and launch.log
    running = until(launch.run_id, "iteration")
    assert running.state == "running" and running.kind == "train" and running.stage == "train"
    it = running.iteration
    assert it is not None and running.total == 6 and running.step_time_ms == 400.0
    assert running.last_loss == pytest.approx(1.0 / it, rel=1e-5)
    assert running.eta_s == pytest.approx((6 - it) * 0.4)
    assert running.pgid == launch.pgid and launch.pgid in running.pids
    assert running.master_port == launch.master_port

    final = wait_job(launch.run_id, timeout_s=DEADLINE_S)
    assert final.state == "succeeded" and final.exit_code == 0 and final.root_cause is None
    assert final.iteration == final.total == 6 and final.last_loss == pytest.approx(1 / 6, rel=1e-5)
    assert final.message == "training finished at iteration 6/6, loss 0.1667" and final.pids == []
    assert [port for _, port in workers(pids)] == [launch.master_port] * 2  # torchrun used the port picked
    assert all(gone(pid) for pid, _ in workers(pids))
    tail = tail_logs(launch.run_id, 2)
    assert "training finished: 6 iterations" in tail.lines[0] and "succeeded" in tail.lines[1]
    assert [j.run_id for j in list_jobs().jobs] == [launch.run_id]
    assert stop_job(launch.run_id, confirm=True).status == "not_running"


@pytest.mark.slow
def test_watchdog_fails_the_run_with_its_root_cause_and_kills_every_worker(ws: Path) -> None:
    job = make_job(ws)
    pids = stand_in(job, "pretrain.sh", "fatal", iters=50, pause=0.2)
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True, stop_grace_s=5))
    assert launch.run_id is not None
    final = wait_job(launch.run_id, timeout_s=DEADLINE_S)
    assert final.state == "failed" and final.report is not None
    assert final.report["stopped_by"] == "watchdog" and "watchdog" in final.message
    cause = final.root_cause
    assert cause is not None and cause.category == "hccl_port_in_use"
    assert cause.rule_id == "hccl_host_port_in_use" and any("EI0019" in line for line in cause.evidence)
    assert any("HCCL_IF_BASE_PORT" in (f.command or "") for f in cause.fixes)
    assert final.iteration == 2 and final.pids == []
    everything = stage_pids(launch.run_id) + [pid for pid, _ in workers(pids)]
    assert len(set(everything)) >= 4  # bash, torchrun and its two workers (in sessions of their own)
    assert all(gone(pid) for pid in everything), [p for p in everything if not gone(p)]
    # diagnosed afterwards, the run's log still names the port, and the watchdog's own stop as a consequence
    later = diagnose_errors(DiagnoseRequest(run_id=launch.run_id))
    assert later.root_cause is not None and later.root_cause.rule_id == "hccl_host_port_in_use"
    stop = [f for f in later.findings if f.rule_id == "mm_agent_watchdog_stop"]
    assert stop and stop[0].effect == "warning" and "port" in stop[0].title, [
        f.rule_id for f in later.findings
    ]


@pytest.mark.slow
def test_stop_job_stops_the_whole_run_and_nothing_else(
    ws: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    job = make_job(ws)
    pids = stand_in(job, "pretrain.sh", "stubborn")
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started.append(sibling)
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True))
    assert launch.run_id is not None
    ranks = [pid for pid, _ in workers(pids)]

    dry = stop_job(launch.run_id)
    assert dry.status == "dry_run" and set(ranks) <= set(dry.targets) and sibling.pid not in dry.targets
    assert launch.pgid in dry.targets and all(not gone(pid) for pid in ranks)
    assert main(["stop", launch.run_id]) == 0  # the CLI's dry run too

    with pytest.raises(MMAgentError):  # a second start of the same stage is refused while it runs
        start_stage(StageRequest(job_dir="job", stage="train", confirm=True))

    done = stop_job(launch.run_id, confirm=True, timeout_s=1)
    assert done.status == "stopped" and done.state == "stopped"
    assert set(ranks) <= set(done.killed), "the workers ignore SIGTERM: SIGKILL must have reached them"
    everything = set(stage_pids(launch.run_id) + ranks + dry.targets)
    assert all(gone(pid) for pid in everything), [p for p in everything if not gone(p)]
    assert sibling.poll() is None, "a process mm-agent did not start must survive"
    final = job_status(launch.run_id)
    assert final.state == "stopped" and final.report is not None and final.report["stopped_by"] == "user"
    # the signals in its log are mm-agent's stop, not a kill from outside the job
    later = diagnose_errors(DiagnoseRequest(run_id=launch.run_id))
    assert later.root_cause is not None and later.root_cause.rule_id == "stopped_by_mm_agent", (
        later.root_cause
    )
    assert stop_job(launch.run_id, confirm=True).status == "not_running"


@pytest.mark.slow
def test_a_requested_stop_is_not_turned_into_a_watchdog_failure(ws: Path) -> None:
    """The stop's own SIGTERM reaches the log as a death signal (a fatal signature) while the stage is
    still shutting down: the run must end "stopped" by the user, not "failed" by the watchdog."""
    job = make_job(ws)
    stand_in(job, "pretrain.sh", "train")  # keeps the header the launcher reads
    script = job / "pretrain.sh"
    header = script.read_text().rsplit("\n", 2)[0]  # drop the torchrun line
    script.write_text(
        header + "\n"
        "trap 'echo \"Received 15 death signal, shutting down workers\"; sleep 2; exit 143' TERM\n"
        "echo ready\n"
        "while :; do sleep 0.1; done\n"
    )
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True))
    assert launch.run_id is not None
    end = time.monotonic() + DEADLINE_S
    while "ready" not in "\n".join(tail_logs(launch.run_id, 5).lines):
        assert time.monotonic() < end, "the stage did not start"
        time.sleep(0.1)
    assert stop_job(launch.run_id, confirm=True, timeout_s=10).state == "stopped"
    final = job_status(launch.run_id)
    assert final.report is not None and final.report["stopped_by"] == "user", final.report
    assert any("death signal" in line for line in tail_logs(launch.run_id, 20).lines)


@pytest.mark.slow
def test_stage_outliving_a_killed_supervisor_is_reported_and_stoppable(ws: Path) -> None:
    job = make_job(ws)
    pids = stand_in(job, "pretrain.sh", "stubborn")
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True))
    assert launch.run_id is not None and launch.supervisor_pid is not None
    ranks = [pid for pid, _ in workers(pids)]
    end = time.monotonic() + DEADLINE_S
    while not set(ranks) <= set(stage_pids(launch.run_id)):  # the supervisor records the workers
        assert time.monotonic() < end
        time.sleep(0.1)
    os.kill(launch.supervisor_pid, signal.SIGKILL)
    while not gone(launch.supervisor_pid):
        assert time.monotonic() < end
        time.sleep(0.05)

    orphaned = job_status(launch.run_id)
    assert orphaned.state == "killed" and set(ranks) <= set(orphaned.pids)
    assert orphaned.stop_hint is not None and f"mm-agent stop {launch.run_id} --yes" in orphaned.stop_hint
    done = stop_job(launch.run_id, confirm=True, timeout_s=1)
    assert done.status == "stopped" and done.state == "stopped" and set(ranks) <= set(done.killed)
    assert all(gone(pid) for pid in [*ranks, *stage_pids(launch.run_id)])


@pytest.mark.slow
def test_cli_extract_and_train_wait_and_report(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = make_job(ws)
    stand_in(job, "feature_extract/feature_extraction.sh", "extract", iters=4, pause=0.2)
    assert main(["extract", "job"]) == 0
    assert "dry run" in capsys.readouterr().out and not runs_dir().exists()

    assert main(["extract", "job", "--yes", "--wait", "--json"]) == 0
    extracted = JobStatus.model_validate_json(capsys.readouterr().out)
    assert extracted.state == "succeeded" and extracted.kind == "extract"
    assert extracted.extract_done == extracted.extract_total == 4 and extracted.eta_s == 0

    stand_in(job, "pretrain.sh", "fail")
    assert main(["train", "job", "--yes", "--wait", "--nproc", "2"]) == 1
    shown = capsys.readouterr().out
    assert "failed" in shown and "exited with code 1" in shown

    assert main(["jobs", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [j["kind"] for j in listing["jobs"]] == ["train", "extract"]
    run_id = listing["jobs"][0]["run_id"]
    assert main(["runs"]) == 0 and run_id[:12] in capsys.readouterr().out  # the old name still lists
    assert main(["status", run_id, "--json"]) == 0
    assert JobStatus.model_validate_json(capsys.readouterr().out).state == "failed"
    assert main(["logs", run_id, "-n", "1"]) == 0
    assert capsys.readouterr().out.startswith("[mm-agent] failed:")
    assert main(["logs", run_id, "-f", "-n", "1"]) == 0  # a finished run: prints and returns
    assert main(["status", "../etc"]) == 2 and "invalid run id" in capsys.readouterr().err
    assert main(["stop", "train-19700101-000000-abcdef"]) == 2


@pytest.mark.slow
def test_mindspeed_mm_job_runs_its_rendered_script(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered MindSpeed-MM script itself (cd MM_ROOT, torchrun ... | tee, step-time summary) under
    the same management; `torchrun` is a stand-in first on PATH, as MindSpeed-MM cannot run here."""
    bin_dir = ws / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    lines = "\n".join(
        f"print({json.dumps(f' [2026-11-22 10:00:0{i}] iteration {i}/ 3 | consumed samples: {i} | elapsed time per iteration (ms): 12.5 | loss: 0.5 |')})"
        for i in (1, 2, 3)
    )
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('fake torchrun', *sys.argv[1:])\n{lines}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (ws / "MindSpeed-MM").mkdir()
    port = free_port()
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            out_dir="mm",
            mm_root="MindSpeed-MM",
            load_path="ckpt",
            master_port=port,
            confirm=True,
        ),
        root=ws,
    )
    (ws / "ckpt").mkdir()
    (ws / "ckpt" / "latest_checkpointed_iteration.txt").write_text("release")
    (ws / "mm" / "sora_features").mkdir()
    (ws / "mm" / "sora_features" / "data.jsonl").write_text("")
    with socket.socket() as held:  # one node, MASTER_PORT taken from the environment: a busy one is moved
        held.bind(("0.0.0.0", port))
        held.listen()
        moved = start_stage(StageRequest(job_dir="mm", stage="train"))
        assert moved.master_port not in (None, port) and moved.env["MASTER_PORT"] == str(moved.master_port)
    launch = start_stage(StageRequest(job_dir="mm", stage="train", confirm=True))
    assert launch.runtime == "mindspeed-mm" and launch.master_port == port
    assert launch.env["MASTER_PORT"] == str(port)
    assert launch.run_id is not None
    final = wait_job(launch.run_id, timeout_s=DEADLINE_S)
    assert final.state == "succeeded", final.log_tail
    assert final.iteration == final.total == 3 and final.step_time_ms == 12.5
    log = "\n".join(final.log_tail)
    assert f"--master_port {port}" in log and "Elapsed Time Per iteration: 12.5 ms" in log
    assert any((ws / "MindSpeed-MM" / "logs").glob("train_*.log"))


# ---------------------------------------------------------------------------------------------------------
# MCP


@pytest.mark.anyio
@pytest.mark.slow
async def test_mcp_launch_status_tail_stop(ws: Path, tmp_path: Path) -> None:
    job = make_job(ws)
    stand_in(job, "pretrain.sh", "train", iters=200, pause=0.3)
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "escape").symlink_to(outside)
    async with Client(build_server(ws), raise_exceptions=True) as client:
        for bad in ("../outside", "/etc", "escape"):
            r = await client.call_tool("launch_training", {"job_dir": bad})
            assert r.is_error and "outside the workspace" in r.content[0].text, bad  # type: ignore[union-attr]
        dry = await client.call_tool("launch_training", {"job_dir": "job"})
        assert not dry.is_error and dry.structured_content is not None
        assert dry.structured_content["status"] == "dry_run" and not runs_dir().exists()

        seen: list[str | None] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(message)

        started = await client.call_tool(
            "launch_training", {"job_dir": "job", "confirm": True}, progress_callback=on_progress
        )
        assert started.structured_content is not None
        run_id = started.structured_content["run_id"]
        assert started.structured_content["status"] == "started" and run_id and run_id in (seen[0] or "")

        end = time.monotonic() + DEADLINE_S
        while True:
            status = await client.call_tool("job_status", {"run_id": run_id, "log_lines": 3, "detail": True})
            body = status.structured_content
            assert body is not None and body["state"] == "running", body
            if (body["iteration"] or 0) >= 1:
                break
            assert time.monotonic() < end
            await anyio.sleep(0.2)
        assert body["total"] == 200 and body["last_loss"] is not None and body["eta_s"] > 0

        tail = await client.call_tool("tail_logs", {"run_id": run_id, "lines": 500})
        assert " iteration " in tail.content[0].text  # type: ignore[union-attr]  # the lines are in the text
        too_many = await client.call_tool("tail_logs", {"run_id": run_id, "lines": 501})
        assert too_many.is_error

        dry_stop = await client.call_tool("stop_job", {"run_id": run_id})
        assert dry_stop.structured_content is not None and dry_stop.structured_content["status"] == "dry_run"
        stopped = await client.call_tool("stop_job", {"run_id": run_id, "confirm": True, "timeout_s": 5})
        assert stopped.structured_content is not None and stopped.structured_content["state"] == "stopped"
        final = await client.call_tool("job_status", {"run_id": run_id})
        assert final.structured_content is not None and final.structured_content["state"] == "stopped"

        missing = await client.call_tool("job_status", {"run_id": "train-nope"})
        assert missing.is_error and "no run" in missing.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
@pytest.mark.slow
async def test_mcp_stdio_dry_run(ws: Path) -> None:
    job = make_job(ws)
    stand_in(job, "pretrain.sh", "train")
    env = {**os.environ, "MM_AGENT_STATE_DIR": os.environ["MM_AGENT_STATE_DIR"]}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mm_agent", "serve", "--workspace", str(ws)], env=env
    )
    async with Client(params) as client:
        dry = await client.call_tool("launch_training", {"job_dir": "job", "nproc_per_node": 1})
        assert dry.structured_content is not None and dry.structured_content["status"] == "dry_run"
        assert dry.structured_content["env"]["NPUS_PER_NODE"] == "1"
        bad = await client.call_tool("extract_features", {"job_dir": "job", "env": {"BASH_ENV": "/x"}})
        assert bad.is_error and "may not be set" in bad.content[0].text  # type: ignore[union-attr]
    assert not runs_dir().exists()
