"""Issue 25 (low): 20 concurrent confirmed `prepare_dataset` calls into one folder raced on temp names made
of the pid only. Calls of one server are threads of one process, so they all opened `.data.json.<pid>.tmp`
(`O_EXCL`: "File exists"), and the ledger of written files was rewritten through one shared temp name
(a rename of a name another thread had already renamed: "No such file or directory", and lost entries).

Real clips (PyAV), a real one-NPU Wan job (render_job), the core function from 20 threads at once and a real
stdio server with 20 calls in flight: every call is answered without error, the index is valid and complete,
the ledger records every file written, and no temp file is left anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mcp import Client, StdioServerParameters

from mm_agent.dataset import DatasetRequest, DatasetResult, prepare_dataset
from mm_agent.render import RenderRequest, render_job

REPO = Path(__file__).resolve().parents[2]
CALLS = 20
CLIPS = 4  # the one-NPU job's extraction has global batch size 1: MindSpeed-MM keeps sizes with 4+ clips
ARGS = {"dir": "clips", "model": "wan2.1", "job_dir": "job", "confirm": True}


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`clips/` (4 distinct 17-frame 240x416 clips with captions) and `job/` (Wan 2.1 t2v on one NPU)."""
    from runtime.synth import write_mp4

    lib = tmp_path_factory.mktemp("race")
    ramp = np.arange(416, dtype=np.uint8)[None, None, :]
    (lib / "clips").mkdir()
    for i in range(CLIPS):
        frames = np.zeros((17, 240, 416, 3), np.uint8)
        frames[..., 0] = 50 * i
        frames[..., 1] = ramp
        write_mp4(lib / "clips" / f"clip{i}.mp4", frames, 16)
        (lib / "clips" / f"clip{i}.txt").write_text(f"clip number {i}", encoding="utf-8")
    request = RenderRequest(
        model="wan2.1",
        task="t2v",
        out_dir="job",
        num_frames=17,
        max_height=240,
        max_width=416,
        npus_per_node=1,
        confirm=True,
    )
    render_job(request, root=lib)
    return lib


@pytest.fixture
def folder(ws: Path, library: Path) -> Path:
    shutil.copytree(library / "clips", ws / "clips")
    shutil.copytree(library / "job", ws / "job")
    # a dry run first: the probes are cached, so the 20 calls reach their writes at about the same moment
    dry = prepare_dataset(DatasetRequest(**{**ARGS, "confirm": False}), root=ws, workers=1)
    assert dry.accepted == CLIPS, dry.rejected
    return ws / "clips"


def _state() -> Path:
    return Path(os.environ["MM_AGENT_STATE_DIR"])


def _check_outputs(clips: Path) -> None:
    """The index holds every clip once, data.txt names it, the ledger knows every file, no temp file is left."""
    records = json.loads((clips / "data.json").read_text(encoding="utf-8"))
    assert sorted(r["path"] for r in records) == [f"clip{i}.mp4" for i in range(CLIPS)]
    assert (clips / "data.txt").read_text(encoding="utf-8") == f"{clips},{clips / 'data.json'}\n"
    assert (clips / "data.stats.png").read_bytes().startswith(b"\x89PNG")
    leftovers = [p.name for p in clips.iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temp files left in the dataset folder: {leftovers}"
    datasets = _state() / "datasets"
    stray = [p.name for p in datasets.iterdir() if p.name.startswith(".")]
    assert stray == [], f"temp files left in the state dir: {stray}"
    ledger = json.loads((datasets / "written.json").read_text(encoding="utf-8"))
    for name in ("data.json", "data.txt", "data.stats.png"):
        digest = hashlib.sha256((clips / name).read_bytes()).hexdigest()
        assert ledger.get(str(clips / name)) == digest, f"the ledger lost {name}"


def test_twenty_threads_confirm_into_one_folder(ws: Path, folder: Path) -> None:
    """20 in-process core calls released together (what 20 tool calls of one server are: threads)."""
    gate = threading.Barrier(CALLS)
    results: list[DatasetResult] = []
    errors: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        gate.wait()
        try:
            result = prepare_dataset(DatasetRequest(**ARGS), root=ws, workers=1)
        except Exception as exc:  # every failure is collected: the assertion names them all
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
            return
        with lock:
            results.append(result)

    threads = [threading.Thread(target=call) for _ in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], f"{len(errors)} of {CALLS} calls failed: {errors[:3]}"
    assert len(results) == CALLS
    assert {r.status for r in results} <= {"written", "unchanged"}
    assert all(r.accepted == CLIPS and r.written == str(folder / "data.json") for r in results)
    _check_outputs(folder)


def test_twenty_calls_in_flight_on_a_stdio_server(ws: Path, folder: Path) -> None:
    """A real `mm-agent serve` over stdio with 20 confirmed calls sent at once."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mm_agent", "serve", "--workspace", str(ws)],
        cwd=str(REPO),
        env={**os.environ},
    )
    answers: list[Any] = []

    async def go() -> None:
        async with Client(params) as client:

            async def one() -> None:
                answers.append(await client.call_tool("prepare_dataset", ARGS))

            async with anyio.create_task_group() as group:
                for _ in range(CALLS):
                    group.start_soon(one)

    anyio.run(go)
    assert len(answers) == CALLS
    failed = ["".join(getattr(c, "text", "") for c in a.content) for a in answers if a.is_error]
    assert failed == [], f"{len(failed)} of {CALLS} calls failed: {failed[:3]}"
    statuses = {a.structured_content["status"] for a in answers}
    assert statuses <= {"written", "unchanged"}
    _check_outputs(folder)


def test_runtime_atomic_writes_from_threads(tmp_path: Path) -> None:
    """The bundled runtime's atomic writer (extraction progress, reports, features) had the same pid-only temp
    name: 19 of 20 threads writing one file at once failed with FileNotFoundError."""
    from runtime.atomic import TEMP_MARK, write_text_atomic

    gate = threading.Barrier(CALLS)
    errors: list[str] = []

    def write(i: int) -> None:
        gate.wait()
        try:
            write_text_atomic(tmp_path / "report.json", json.dumps({"writer": i, "pad": "x" * 100_000}))
        except Exception as exc:  # collected: the assertion names them
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], f"{len(errors)} of {CALLS} writes failed: {errors[:3]}"
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["writer"] in range(CALLS)
    assert [p.name for p in tmp_path.iterdir() if TEMP_MARK in p.name] == []
