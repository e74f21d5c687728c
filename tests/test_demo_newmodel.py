"""`mm-agent demo --new-model`: MindSpeed-MM's new-model flow through the CLI, as a user runs it: the scaffold
writes a DiT of the user's own, the registry finds it, the bundled runtime trains that very file on two processes
(FSDP2) with the loss falling, and samples an mp4 from its checkpoint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from demorun import cli, demo_cli

from mm_agent.demo import DemoReport
from mm_agent.demo_newmodel import NEW_MODEL_NAME, NEW_MODEL_STAGES


def _run(root: Path, *extra: str) -> tuple[DemoReport, subprocess.CompletedProcess[str]]:
    return demo_cli(root, "--new-model", *extra)


@pytest.mark.slow
def test_new_model_demo_trains_the_scaffolded_dit(tmp_path: Path) -> None:
    report, proc = _run(tmp_path, "--clips", "4", "--iters", "30")
    assert report.ok and proc.returncode == 0, (report.message, proc.stderr[-2000:])
    assert [s.name for s in report.stages] == list(NEW_MODEL_STAGES) and all(s.ok for s in report.stages)
    assert report.loss_first is not None and report.loss_last is not None
    assert report.loss_last < report.loss_first
    run = Path(report.run_dir)
    code = Path(report.artifacts.code or "")
    dit = code / f"mindspeed_mm/models/predictor/dits/{NEW_MODEL_NAME}_dit.py"
    assert dit.is_file() and (run / ".mm-agent/models" / f"{NEW_MODEL_NAME}.yaml").is_file()
    # the bundled runtime trained the scaffolded file itself, on two processes
    script = (run / "job" / "pretrain.sh").read_text()
    assert "-m runtime.user_train" in script and str(dit) in script
    log = Path(report.artifacts.train_log or "").read_text()
    assert "NPUS_PER_NODE=2" in log.splitlines()[0]
    assert f"building TinyVideoDiT from {dit}" in log
    assert report.artifacts.sample and Path(report.artifacts.sample).stat().st_size > 0
    assert report.artifacts.checkpoint and Path(report.artifacts.checkpoint).is_dir()


def test_new_model_does_not_combine_with_vlm(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*cli(), "demo", "--new-model", "--vlm", "--dir", str(tmp_path / "d")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--new-model" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "d").exists()
