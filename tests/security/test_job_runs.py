"""Runs that cannot collide, and jobs confined at launch (issue 12, items 5 and 3), with real processes.

Holes guarded here:
  * after kill -9 of a job's supervisor the orphaned ranks kept training, `job_status` said "killed" and a
    second `launch_training` was accepted, so two trainings wrote one checkpoint dir;
  * every job in a workspace defaulted to the same save_path, so a second job silently "resumed" the
    first one's checkpoint (`--auto-resume`) and trained zero steps;
  * extraction and training read and wrote outside the workspace: a job rendered with outside paths (or
    by the CLI from another directory) was launched over MCP;
  * a FIFO among a job's inputs blocked the launch forever;
  * job requests were unbounded (env entries, ids, job_dir).
The stage scripts are replaced by stand-ins that run a real torchrun with `fixtures/job_worker.py`
(no torch import), as in tests/test_jobs.py; everything else (render, launch, supervisor, status, stop)
is the real thing. (Named test_job_runs.py: a second `test_jobs.py` module would clash with
tests/test_jobs.py at collection, as tests/ has no `__init__.py`.)
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil
import pytest
from mcp import Client
from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.jobs import (
    JobStatusRequest,
    LaunchRequest,
    StageRequest,
    StopJobRequest,
    TailRequest,
    job_status,
    start_stage,
    stop_job,
    wait_job,
)
from mm_agent.render import RenderRequest, render_job
from mm_agent.runs import runs_dir
from mm_agent.server import build_server
from mm_agent.validate.shell import parse_script

WORKER = Path(__file__).resolve().parent.parent / "fixtures" / "job_worker.py"
DEADLINE_S = 120.0  # hang guard: never reached when the code works
RECORD = "mm_agent_job.json"
TRACKER = "latest_checkpointed_iteration.txt"
T = TypeVar("T")


def make_job(ws: Path, name: str = "job", **fields: Any) -> Path:
    """A rendered bundled Wan2.1 t2v job (over MCP's core: `root=ws`) with its inputs in place."""
    render_job(
        RenderRequest(
            **{
                "model": "wan2.1",
                "task": "t2v",
                "out_dir": name,
                "npus_per_node": 2,
                "weights_dir": "weights",
                "load_path": "ckpt",
                "dataset_dir": "dataset",
                "runtime": "bundled",
                "confirm": True,
                **fields,
            }
        ),
        root=ws,
    )
    job = ws / name
    (ws / "dataset").mkdir(exist_ok=True)
    (ws / "dataset" / "data.json").write_text("[]")
    (job / "sora_features").mkdir(exist_ok=True)
    (job / "sora_features" / "data.jsonl").write_text("")
    (ws / "ckpt").mkdir(exist_ok=True)
    (ws / "ckpt" / TRACKER).write_text("release")
    return job


def save_path_of(job: Path) -> str:
    """SAVE_PATH as the rendered training script assigns it (read the way bash would)."""
    script = job / "pretrain.sh"
    value = parse_script(str(script), script.read_text()).env.get("SAVE_PATH")
    assert value, "the rendered training script sets SAVE_PATH"
    return value


def stand_in(job: Path, mode: str, iters: int, pause: float) -> Path:
    """Replace pretrain.sh by a torchrun of the stand-in worker that keeps the rendered SAVE_PATH and, when
    training ends, saves a checkpoint there (the tracker file) as the real runtime does."""
    pids = job / f"pids-{mode}"
    pids.mkdir(exist_ok=True)
    save = save_path_of(job)
    (job / "pretrain.sh").write_text(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        f"PYTHON=${{PYTHON:-{shlex.quote(sys.executable)}}}\n"
        "NPUS_PER_NODE=${NPUS_PER_NODE:-2}\n"
        "MASTER_PORT=${MASTER_PORT:-6000}\n"
        f"LOAD_PATH={shlex.quote(str(job.parent / 'ckpt'))}\n"
        f"SAVE_PATH={shlex.quote(save)}\n"
        '"$PYTHON" -m torch.distributed.run --nproc_per_node "$NPUS_PER_NODE" --master_port "$MASTER_PORT" '
        f"{shlex.quote(str(WORKER))} {mode} {shlex.quote(str(pids))} {iters} {pause}\n"
        f'mkdir -p "$SAVE_PATH" && echo {iters} > "$SAVE_PATH/{TRACKER}"\n'
    )
    return pids


def ranks(pids: Path) -> list[int]:
    end = time.monotonic() + DEADLINE_S
    while len(list(pids.glob("rank*.pid"))) < 2:
        assert time.monotonic() < end, "workers did not start"
        time.sleep(0.1)
    time.sleep(0.1)
    return sorted(int(f.read_text().split()[0]) for f in pids.glob("rank*.pid"))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def refused(call: Callable[[], object]) -> MMAgentError:
    with pytest.raises(MMAgentError) as err:
        call()
    assert err.value.fix, "every refusal names its fix"
    return err.value


def guarded(call: Callable[[], T], fifos: list[Path], timeout_s: float = 30.0) -> T:
    """Run `call` in a thread; if it is still blocked after `timeout_s` (on a FIFO), open the FIFOs for
    writing so the blocked reader gets EOF and the thread ends, then fail."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue
        thread.join(10)
        pytest.fail(f"the call blocked on a FIFO for {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_orphans_of_a_killed_supervisor_hold_the_job_until_stop_job_stops_them(ws: Path) -> None:
    job = make_job(ws)
    pids = stand_in(job, "train", iters=2000, pause=0.2)
    other = make_job(ws, "other", save_path=str(job / "checkpoints"))  # trains into the same save_path
    stand_in(other, "train", iters=2, pause=0.1)
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True))
    assert launch.run_id is not None and launch.supervisor_pid is not None
    workers = ranks(pids)
    end = time.monotonic() + DEADLINE_S
    while not set(workers) <= set(job_status(launch.run_id).pids):
        assert time.monotonic() < end, "the supervisor did not record the workers"
        time.sleep(0.1)
    os.kill(launch.supervisor_pid, signal.SIGKILL)
    while not gone(launch.supervisor_pid):
        assert time.monotonic() < end
        time.sleep(0.05)
    assert not any(gone(pid) for pid in workers), "the orphaned ranks keep training"

    for stage in ("train", "extract"):  # any stage of the job, dry run or not
        err = refused(lambda s=stage: start_stage(StageRequest(job_dir="job", stage=s, confirm=True)))
        assert launch.run_id in err.message and "still run" in err.message
        assert f"mm-agent stop {launch.run_id} --yes" in (err.fix or "")
    err = refused(lambda: start_stage(StageRequest(job_dir="other", stage="train")))
    assert err.field == "save_path" and str(job / "checkpoints") in err.message

    status = job_status(launch.run_id)
    assert status.state == "killed" and set(workers) <= set(status.orphans)
    assert "still run" in status.message and status.stop_hint is not None
    assert f"mm-agent stop {launch.run_id} --yes" in status.stop_hint

    stopped = stop_job(launch.run_id, confirm=True, timeout_s=5)
    assert stopped.status == "stopped" and set(workers) <= set(stopped.targets)
    assert all(gone(pid) for pid in workers), [p for p in workers if not gone(p)]
    after = job_status(launch.run_id)
    assert after.state == "stopped" and after.orphans == []
    assert start_stage(StageRequest(job_dir="job", stage="train")).status == "dry_run"


def test_two_jobs_in_one_workspace_get_their_own_save_path(ws: Path) -> None:
    first, second = make_job(ws, "first"), make_job(ws, "second")
    assert [save_path_of(j) for j in (first, second)] == [
        str(first / "checkpoints"),
        str(second / "checkpoints"),
    ]
    features = [
        json.loads((j / "tools.json").read_text())["sorafeature"]["save_path"] for j in (first, second)
    ]
    assert features == [str(first / "sora_features"), str(second / "sora_features")]


@pytest.mark.slow
def test_a_checkpoint_written_by_another_job_is_never_resumed(ws: Path) -> None:
    first = make_job(ws, "first")
    stand_in(first, "train", iters=3, pause=0.05)
    run = start_stage(StageRequest(job_dir="first", stage="train", confirm=True))
    assert run.run_id is not None
    assert wait_job(run.run_id, timeout_s=DEADLINE_S).state == "succeeded"
    save = first / "checkpoints"
    assert (save / TRACKER).read_text().strip() == "3"

    second = make_job(ws, "second", save_path=str(save))
    stand_in(second, "train", iters=3, pause=0.05)
    for confirm in (False, True):  # the dry run reports the same refusal
        err = refused(lambda c=confirm: start_stage(StageRequest(job_dir="second", stage="train", confirm=c)))
        assert err.field == "save_path" and str(save) in err.message and str(first) in err.message
        assert "--save-path" in (err.fix or "") and f"move {save} away" in (err.fix or "")
    record = json.loads((save / RECORD).read_text())
    assert record["job_dir"] == str(first) and run.save_path == str(save)

    # The same job with more iterations resumes its own checkpoint; as another experiment it does not.
    make_job(ws, "first", train_iters=10, force=True)
    stand_in(first, "train", iters=3, pause=0.05)
    assert start_stage(StageRequest(job_dir="first", stage="train")).status == "dry_run"
    make_job(ws, "first", seed=7, force=True)
    err = refused(lambda: start_stage(StageRequest(job_dir="first", stage="train")))
    assert "seed changed" in err.message

    (save / RECORD).unlink()  # a checkpoint nobody recorded: not this job's to resume
    make_job(ws, "first", force=True)
    err = refused(lambda: start_stage(StageRequest(job_dir="first", stage="train")))
    assert f"no {RECORD}" in err.message


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the workspace with a converted checkpoint and a dataset."""
    place = tmp_path / "outside"
    for folder in ("ckpt", "dataset"):
        (place / folder).mkdir(parents=True)
    (place / "ckpt" / TRACKER).write_text("release")
    (place / "dataset" / "data.json").write_text("[]")
    return place


def test_a_job_rendered_with_outside_paths_is_refused_at_launch_with_root(ws: Path, outside: Path) -> None:
    render_job(  # by the CLI (no root): an absolute save_path outside the workspace
        RenderRequest(
            model="wan2.1", task="t2v", out_dir="abs", runtime="bundled", npus_per_node=2,
            save_path=str(outside / "save"), confirm=True,
        )
    )  # fmt: skip
    err = refused(lambda: start_stage(StageRequest(job_dir="abs", stage="train"), root=ws))
    assert err.field == "save_path" and "outside the workspace" in err.message
    assert err.file == str(ws / "abs" / "job.yaml")


def test_a_job_rendered_from_another_directory_is_refused_at_launch_with_root(
    ws: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its relative paths were resolved where the CLI ran, so job.yaml looks fine: the script does not."""
    monkeypatch.chdir(outside)
    render_job(
        RenderRequest(
            model="wan2.1", task="t2v", out_dir=str(ws / "rel"), runtime="bundled", npus_per_node=2,
            weights_dir="weights", load_path="ckpt", dataset_dir="dataset", confirm=True,
        )
    )  # fmt: skip
    monkeypatch.chdir(ws)
    (ws / "rel" / "sora_features").mkdir()
    (ws / "rel" / "sora_features" / "data.jsonl").write_text("")
    assert start_stage(StageRequest(job_dir="rel", stage="train")).status == "dry_run"  # the CLI trusts it
    err = refused(lambda: start_stage(StageRequest(job_dir="rel", stage="train"), root=ws))
    assert err.field == "LOAD_PATH" and str(outside / "ckpt") in err.message
    err = refused(lambda: start_stage(StageRequest(job_dir="rel", stage="extract"), root=ws))
    assert "dataset folder" in err.message and "outside the workspace" in err.message

    async def over_mcp() -> Any:
        async with Client(build_server(ws)) as client:
            return await client.call_tool("launch_training", {"job_dir": "rel", "confirm": True})

    result = anyio.run(over_mcp)
    assert result.is_error and "LOAD_PATH" in result.content[0].text and "fix:" in result.content[0].text
    assert not runs_dir().exists(), "nothing was started"


def test_a_fifo_as_the_dataset_index_is_refused(ws: Path) -> None:
    make_job(ws)
    index = ws / "dataset" / "data.json"  # data.txt's second column: extraction would block reading it
    index.unlink()
    os.mkfifo(index)
    err = guarded(lambda: refused(lambda: start_stage(StageRequest(job_dir="job", stage="extract"))), [index])
    assert "FIFO" in err.message and err.file == str(index)


def test_a_fifo_as_a_job_config_is_refused_without_hanging(ws: Path) -> None:
    job = make_job(ws)
    config = job / "feature_extract" / "data.json"  # read by the launcher itself
    config.unlink()
    os.mkfifo(config)
    err = guarded(
        lambda: refused(lambda: start_stage(StageRequest(job_dir="job", stage="extract"))), [config]
    )
    assert "FIFO" in err.message and err.file == str(config)


def test_job_requests_are_bounded() -> None:
    base = {"job_dir": "job"}
    too_many = {f"NCCL_X{i}": "1" for i in range(33)}
    for bad in (
        {"env": too_many},
        {"env": {"NCCL_DEBUG": "INFO\nLD_PRELOAD=/tmp/x.so"}},
        {"env": {"NCCL_DEBUG": "x" * 1025}},
        {"env": {"nccl debug": "1"}},
        {"job_dir": "job\nrm -rf ~"},
        {"job_dir": "job\x00"},
        {"job_dir": "j" * 5000},
    ):
        with pytest.raises(ValidationError):
            LaunchRequest.model_validate({**base, **bad})
    assert LaunchRequest.model_validate({**base, "env": {"NCCL_DEBUG": "INFO"}}).env == {"NCCL_DEBUG": "INFO"}
    for model in (JobStatusRequest, TailRequest, StopJobRequest):
        for run_id in ("a" * 65, "../etc", "train-x\n"):
            with pytest.raises(ValidationError):
                model.model_validate({"run_id": run_id})
        assert model.model_validate({"run_id": "train-20260101-000000-abcdef"})
