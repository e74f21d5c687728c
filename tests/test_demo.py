"""`mm-agent demo` end to end: one real run (torchrun extraction + FSDP2 training + sampling) through the
CLI's `--json` form, then its report and every artefact checked for real (decord, PNG magic, checkpoint
layout, feature count, diagnosis); plus the refusal to write into a directory the demo did not create."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from demorun import CLIPS, ITERS, cli

from mm_agent.cli.demo import print_summary
from mm_agent.demo import LOSS_WINDOW, MARKER, DemoReport, DemoRequest, prepare_run_dir, run_demo
from mm_agent.diagnose import DiagnoseRequest, diagnose_errors
from mm_agent.errors import MMAgentError

FRAMES = 17
STAGES = [
    "dataset",
    "weights",
    "route",
    "render",
    "validate",
    "convert",
    "extract",
    "train",
    "sample",
    "diagnose",
]


@pytest.mark.slow
def test_demo_passes_and_the_loss_falls(demo: tuple[DemoReport, subprocess.CompletedProcess[str]]) -> None:
    report, proc = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report.ok, report.message
    assert [s.name for s in report.stages] == STAGES
    assert all(s.ok for s in report.stages), [s for s in report.stages if not s.ok]
    assert len(report.losses) == ITERS
    window = report.loss_window
    assert window == max(LOSS_WINDOW, ITERS // 10)
    assert report.loss_first == pytest.approx(sum(report.losses[:window]) / window)
    assert report.loss_last == pytest.approx(sum(report.losses[-window:]) / window)
    assert report.loss_last is not None and report.loss_first is not None
    assert report.loss_last < report.loss_first
    on_disk = json.loads(Path(report.artifacts.report or "").read_text(encoding="utf-8"))
    assert DemoReport.model_validate(on_disk) == report


@pytest.mark.slow
def test_demo_artifacts_are_real(demo: tuple[DemoReport, subprocess.CompletedProcess[str]]) -> None:
    import decord

    a = demo[0].artifacts
    assert a.sample and a.loss_curve and a.checkpoint and a.features and a.train_log and a.converted
    video = decord.VideoReader(a.sample)
    assert len(video) == FRAMES
    assert Path(a.loss_curve).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ckpt = Path(a.checkpoint)
    tracker = (ckpt.parent / "latest_checkpointed_iteration.txt").read_text(encoding="utf-8").strip()
    assert ckpt.name == f"iter_{int(tracker):07d}" and int(tracker) == ITERS
    assert (ckpt / "mp_rank_00" / "model_optim_rng.pt").is_file()
    assert (Path(a.converted) / "latest_checkpointed_iteration.txt").read_text(
        encoding="utf-8"
    ).strip() == "release"
    features = Path(a.features)
    records = [
        json.loads(line) for line in (features / "data.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert len(records) == CLIPS == len(list((features / "features").glob("*.pt")))
    assert len({r["file"] for r in records}) == CLIPS  # same basenames in set_a/set_b did not collide
    assert a.tensorboard and any(Path(a.tensorboard).glob("events.out.tfevents.*"))
    diagnosis = diagnose_errors(DiagnoseRequest(paths=[a.train_log]))
    assert diagnosis.root_cause is None or diagnosis.root_cause.effect != "fatal"
    assert diagnosis.progress.iteration == ITERS


@pytest.mark.slow
def test_summary_table_names_every_stage(
    demo: tuple[DemoReport, subprocess.CompletedProcess[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    print_summary(demo[0])
    out = capsys.readouterr().out
    assert all(name in out for name in STAGES) and "PASSED" in out
    assert demo[0].artifacts.sample and Path(demo[0].artifacts.sample).name in out
    assert all(f"✓ {name}" in demo[1].stderr for name in STAGES)  # the live display, on stderr


@pytest.mark.slow
def test_demo_dir_is_reused_with_a_new_run_folder(
    demo: tuple[DemoReport, subprocess.CompletedProcess[str]],
) -> None:
    run_dir = Path(demo[0].run_dir)
    demo_dir = run_dir.parent
    assert (demo_dir / MARKER).is_file()
    second = prepare_run_dir(demo_dir)
    assert second.parent == demo_dir and second != run_dir and not any(second.iterdir())
    assert run_dir.is_dir()  # the first run is untouched
    second.rmdir()


def test_refuses_a_non_demo_directory(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me", encoding="utf-8")
    before = sorted(p.name for p in user.iterdir())
    with pytest.raises(MMAgentError) as exc:
        run_demo(DemoRequest(dir=str(user)))
    assert exc.value.field == "--dir" and "not an mm-agent demo directory" in exc.value.message
    assert sorted(p.name for p in user.iterdir()) == before
    assert (user / "notes.txt").read_text(encoding="utf-8") == "keep me"


def test_cli_refuses_a_non_demo_directory_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("1,2\n", encoding="utf-8")
    proc = subprocess.run([*cli(), "demo", "--json", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not an mm-agent demo directory" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == ["data.csv"]


def test_request_bounds() -> None:
    with pytest.raises(ValueError):
        DemoRequest(iters=2 * LOSS_WINDOW - 1)
    defaults: dict[str, Any] = DemoRequest().model_dump()
    assert defaults["nproc"] == 2 and defaults["dir"] == "mm-agent-demo"


def test_a_failed_stage_stops_the_run_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    events: list[tuple[str, str]] = []
    req = DemoRequest(dir=str(tmp_path / "demo"), clips=2, request="fine-tune Qwen2.5-VL 7B on my images")
    report = run_demo(req, lambda e: events.append((e.stage, e.state)))
    assert not report.ok
    assert [(s.name, s.ok) for s in report.stages] == [("dataset", True), ("weights", True), ("route", False)]
    assert "qwen2.5vl" in report.stages[-1].detail and "the route stage failed" in report.message
    assert ("route", "failed") in events and not any(stage == "render" for stage, _ in events)
    assert report.loss_first is None and report.artifacts.job is None
    assert DemoReport.model_validate_json(Path(report.run_dir, "demo_report.json").read_text()) == report


@pytest.mark.slow
def test_ctrl_c_stops_the_running_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT to the CLI stops the torchrun stage it started (which runs in its own session) and exits 130."""
    from mm_agent.jobs import job_status

    state = tmp_path / "state"
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(state))
    env = dict(os.environ)
    argv = [*cli(), "demo", "--json", "--dir", str(tmp_path / "demo"), "--clips", "2", "--iters", "6"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list((state / "runs").glob("extract-*/stage.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "extraction never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err
    run_id = next((state / "runs").glob("extract-*")).name
    status = job_status(run_id)
    assert status.state == "stopped" and status.pids == []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.slow
async def test_mcp_job_tools_stop_and_resume_a_real_training(
    demo: tuple[DemoReport, subprocess.CompletedProcess[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a real MCP session: launch the demo job's training (a variant saving every 5 iterations), watch
    it with job_status, stop it after its iteration-10 checkpoint, launch it again: it resumes there."""
    import anyio
    import yaml
    from mcp import Client

    from mm_agent.render import RenderRequest, render_job
    from mm_agent.server import build_server

    report, _ = demo
    run = Path(report.run_dir)
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    spec = yaml.safe_load((run / "job" / "job.yaml").read_text(encoding="utf-8"))
    spec.update(train_iters=30, save_interval=5, save_path=str(run / "resume-ckpt"))
    render_job(RenderRequest(**spec, out_dir=str(run / "job2"), confirm=True))

    async def until(client: Client, run_id: str, done: Any) -> dict[str, Any]:
        end = time.monotonic() + 300
        while True:
            r = await client.call_tool("job_status", {"run_id": run_id, "log_lines": 0, "detail": True})
            body = r.structured_content
            assert body is not None and time.monotonic() < end, body
            if done(body):
                return body
            await anyio.sleep(0.2)

    async with Client(build_server(run), raise_exceptions=True) as client:
        monkeypatch.setenv("MM_AGENT_TRAIN_TEST_DELAY", "0.4")  # slow enough to stop mid-run
        first = await client.call_tool("launch_training", {"job_dir": "job2", "confirm": True})
        assert first.structured_content is not None and first.structured_content["status"] == "started"
        run_id = first.structured_content["run_id"]
        body = await until(client, run_id, lambda b: (b["iteration"] or 0) >= 12 or b["state"] != "running")
        assert body["state"] == "running" and body["total"] == 30 and body["last_loss"] is not None
        stopped = await client.call_tool("stop_job", {"run_id": run_id, "confirm": True})
        assert stopped.structured_content is not None and stopped.structured_content["state"] == "stopped"
        assert int((run / "resume-ckpt" / "latest_checkpointed_iteration.txt").read_text()) >= 10

        monkeypatch.delenv("MM_AGENT_TRAIN_TEST_DELAY")
        again = await client.call_tool("launch_training", {"job_dir": "job2", "confirm": True})
        assert again.structured_content is not None
        second = again.structured_content["run_id"]
        final = await until(client, second, lambda b: b["state"] != "running")
        assert final["state"] == "succeeded" and final["iteration"] == 30, final
        log = await client.call_tool("tail_logs", {"run_id": second, "lines": 500, "detail": True})
        assert log.structured_content is not None
        assert any("resuming from" in line for line in log.structured_content["lines"])
    rows = [json.loads(line) for line in (run / "resume-ckpt" / "losses.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, 31))  # cut back to the checkpoint, then continued


@pytest.mark.slow
def test_lora_demo_trains_an_adapter_and_measures_the_full_fine_tune(tmp_path: Path) -> None:
    """`mm-agent demo --lora --json`: the same report (ok, loss_first, loss_last) for a LoRA job; its
    checkpoints hold the adapter only, and the report sets it against a short full fine-tune."""
    import torch

    env = {**os.environ, "MM_AGENT_STATE_DIR": str(tmp_path / "state")}
    argv = [
        *cli(),
        "demo",
        "--lora",
        "--json",
        "--dir",
        str(tmp_path / "demo"),
        "--clips",
        "4",
        "--iters",
        "20",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    report = DemoReport.model_validate_json(proc.stdout)
    assert proc.returncode == 0 and report.ok, (report.message, proc.stderr[-2000:])
    assert report.loss_first is not None and report.loss_last is not None
    assert report.loss_last < report.loss_first
    f = report.lora
    assert f is not None and 0 < f.trainable_params < f.total_params
    assert abs(f.trainable_share - 100 * f.trainable_params / f.total_params) < 0.01
    assert f.peak_mb and f.full_peak_mb and f.full_iters == 10 and f.memory == "host RSS"
    assert report.artifacts.checkpoint is not None
    state = torch.load(
        Path(report.artifacts.checkpoint) / "mp_rank_00" / "model_optim_rng.pt",
        map_location="cpu",
        weights_only=False,
    )
    keys = list(state["model"])
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys), keys[:5]  # the adapter only
    assert report.artifacts.sample is not None and Path(report.artifacts.sample).stat().st_size > 0
    job = yaml.safe_load((Path(report.run_dir) / "job" / "job.yaml").read_text(encoding="utf-8"))
    assert job["task"] == "lora"
