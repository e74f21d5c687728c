"""`mm-agent demo --vlm` (and `--vlm --lora`): the Qwen2.5-VL pipeline end to end through the CLI, as a user runs
it: every stage passes, the loss falls, held-out exact-match accuracy rises, the checkpoint read in MindSpeed-MM's
layout and its Hugging Face export answer alike, and the artefacts it reports are there. Failure paths: the
route must reach Qwen2.5-VL, and a run whose accuracy does not rise is not ok."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from demorun import demo_cli

from mm_agent.demo import DemoReport, DemoRequest
from mm_agent.demo_vlm import VLM_STAGES, prior_accuracy, run_vlm_demo, vlm_request


def _run(root: Path, *extra: str) -> tuple[DemoReport, subprocess.CompletedProcess[str]]:
    return demo_cli(root, "--vlm", *extra)


def _check(report: DemoReport, proc: subprocess.CompletedProcess[str]) -> None:
    assert report.ok and proc.returncode == 0, (report.message, proc.stderr[-2000:])
    assert [s.name for s in report.stages] == list(VLM_STAGES) and all(s.ok for s in report.stages)
    assert (
        report.loss_first is not None
        and report.loss_last is not None
        and report.loss_last < report.loss_first
    )
    assert report.accuracy_before is not None and report.accuracy_after is not None
    assert report.accuracy_prior is not None and report.heldout
    assert report.accuracy_after > max(
        report.accuracy_before, report.accuracy_prior
    )  # learnt from the pixels
    a = report.artifacts
    assert a.exported and (Path(a.exported) / "config.json").is_file()
    assert any(Path(a.exported).glob("*.safetensors"))
    assert a.evaluation and a.loss_curve and Path(a.loss_curve).is_file()
    after: dict[str, Any] = json.loads(Path(a.evaluation).read_text())
    assert after["total"] == report.heldout and after["accuracy"] == report.accuracy_after
    job_eval = json.loads((Path(report.run_dir) / "job" / "evaluation" / "accuracy.json").read_text())
    assert [r["answer"] for r in job_eval["answers"]] == [r["answer"] for r in after["answers"]]
    assert "category none" in next(s.detail for s in report.stages if s.name == "diagnose")


@pytest.mark.slow
def test_vlm_demo_trains_exports_and_answers_better(tmp_path: Path) -> None:
    report, proc = _run(tmp_path)
    _check(report, proc)
    assert "(ViT and projector frozen" in next(s.detail for s in report.stages if s.name == "render")


@pytest.mark.slow
def test_vlm_lora_demo_merges_the_adapter_before_the_export(tmp_path: Path) -> None:
    report, proc = _run(tmp_path, "--lora", "--nproc", "1")
    _check(report, proc)
    assert report.lora is not None and 0 < report.lora.trainable_share < 100
    assert "adapter merged into its base" in next(s.detail for s in report.stages if s.name == "export")
    manifest = json.loads((Path(report.run_dir) / "checkpoints" / "lora_adapter.json").read_text())
    assert manifest["target_modules"][:3] == ["linear_proj", "linear_fc2", "linear_qkv"]


def test_vlm_defaults_fill_only_what_the_caller_left_unset() -> None:
    req = vlm_request(DemoRequest(vlm=True, iters=7))
    assert req.iters == 7 and req.clips == 512 and "Qwen2.5-VL" in req.request


@pytest.mark.slow
def test_a_run_that_only_learns_the_commonest_answers_is_not_ok(tmp_path: Path) -> None:
    """20 steps teach the answer format and priors, not the images: every stage passes, the demo does not."""
    report, proc = _run(tmp_path, "--clips", "32", "--iters", "20", "--nproc", "1")
    assert not report.ok and proc.returncode == 1
    assert all(s.ok for s in report.stages)
    assert "did not learn from the images" in report.message


def test_the_prior_is_the_commonest_training_answer_per_question(tmp_path: Path) -> None:
    def rows(answers: list[tuple[str, str]]) -> str:
        return json.dumps([{"conversations": [{"from": "human", "value": f"<image>\n{q}"},
                                              {"from": "gpt", "value": a}]} for q, a in answers])  # fmt: skip

    (tmp_path / "train.json").write_text(rows([("colour?", "red"), ("colour?", "red"), ("colour?", "blue"),
                                               ("shape?", "bar")]))  # fmt: skip
    (tmp_path / "heldout.json").write_text(rows([("colour?", "red"), ("colour?", "blue"), ("shape?", "bar"),
                                                 ("size?", "big")]))  # fmt: skip
    assert prior_accuracy(tmp_path / "train.json", tmp_path / "heldout.json") == 0.5


def test_a_request_routed_elsewhere_fails_at_the_route_stage(tmp_path: Path) -> None:
    req = DemoRequest(dir=str(tmp_path / "demo"), vlm=True, clips=2, request="fine-tune Wan2.1 text-to-video")
    report = run_vlm_demo(req)
    assert not report.ok and report.stages[-1].name == "route" and not report.stages[-1].ok
    assert "Qwen2.5-VL" in report.message
