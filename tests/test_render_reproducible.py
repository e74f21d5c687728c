"""Rendering is a pure function of the request: the same jobs rendered in separate processes under different
`PYTHONHASHSEED`s give byte-identical files (and next steps).

Why: `render_job` refuses to replace a job directory whose files differ from a new render ("a different job")
unless forced, so a file whose content follows the hash seed (a set's iteration order, e.g. the Volcano and
AscendJob volume lists) makes re-rendering the same job from a new process fail. Each render runs in a real
child interpreter so the seed really differs; every launcher, MindSpeed-MM and bundled jobs, generative and
VLM models are covered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mm_agent.launchers import LAUNCHER_FILES

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ("0", "1", "2", "3")

# every launcher (2 nodes) over MindSpeed-MM and bundled jobs, generative and VLM, plus single-node jobs
JOBS: dict[str, dict[str, object]] = {
    **{
        f"wan-mm-{launcher}": {"model": "wan2.1", "task": "t2v", "nnodes": 2, "launcher": launcher}
        for launcher in LAUNCHER_FILES
    },
    **{
        f"qwen25vl-mm-{launcher}": {"model": "qwen2.5vl", "task": "sft", "nnodes": 2, "launcher": launcher}
        for launcher in LAUNCHER_FILES
    },
    "wan-bundled-volcano": {
        "model": "wan2.1",
        "task": "t2v",
        "runtime": "bundled",
        "npus_per_node": 2,
        "nnodes": 2,
        "launcher": "volcano",
    },
    "wan-bundled": {"model": "wan2.1", "task": "t2v", "runtime": "bundled", "npus_per_node": 1},
    "wan-lora-14b-ascendjob": {
        "model": "wan2.1",
        "task": "lora",
        "size": "14b",
        "nnodes": 2,
        "launcher": "ascendjob",
    },
    "qwen25vl-bundled": {"model": "qwen2.5vl", "task": "sft", "runtime": "bundled", "npus_per_node": 1},
    "cogvideox-mm": {"model": "cogvideox", "task": "t2v"},
    "qwen3vl-mm-pdsh": {"model": "qwen3vl", "task": "sft", "nnodes": 2, "launcher": "pdsh"},
}

# The child: render every job as a dry run (same workspace, same out dirs) and print each job's file texts.
CHILD = """
import json, sys
from pathlib import Path
from mm_agent.render import RenderRequest, render_job

jobs = json.loads(sys.argv[1])
work = Path(sys.argv[2])
out = {}
for name, spec in jobs.items():
    extra = {"master_addr": "10.0.0.1"} if spec.get("nnodes", 1) > 1 else {}
    result = render_job(RenderRequest(**spec, **extra, out_dir=str(work / name)), root=work)
    out[name] = {"files": {f.path: f.content for f in result.files}, "next_steps": result.next_steps}
print(json.dumps(out))
"""


def _render_in_child(work: Path, seed: str) -> dict[str, dict[str, object]]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(JOBS), str(work)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rendered: dict[str, dict[str, object]] = json.loads(proc.stdout)
    return rendered


def test_every_rendered_file_is_byte_identical_across_processes_and_hash_seeds(tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    first = _render_in_child(work, SEEDS[0])
    assert set(first) == set(JOBS)
    # the launchers' files are there (a job whose launcher fell away would compare nothing)
    for name, spec in JOBS.items():
        launcher = spec.get("launcher")
        if isinstance(launcher, str):
            assert LAUNCHER_FILES[launcher] in first[name]["files"], name  # type: ignore[operator]
    for seed in SEEDS[1:]:
        again = _render_in_child(work, seed)
        for name in JOBS:
            a, b = first[name]["files"], again[name]["files"]
            assert isinstance(a, dict) and isinstance(b, dict)
            assert sorted(a) == sorted(b), (name, seed)
            differing = [path for path in a if a[path] != b[path]]
            assert not differing, f"{name}: {differing} differ between PYTHONHASHSEED={SEEDS[0]} and {seed}"
            assert first[name]["next_steps"] == again[name]["next_steps"], (name, seed)
