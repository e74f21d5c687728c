"""Checkpoint rules against a real Megatron layout: tracker + release/mp_rank_00_000..003 (PP=4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_validate_support import assert_one, copy_job, new_findings, run, sub

from mm_agent.validate.rules_ckpt import expected_rank_dirs


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    target = tmp_path / "weights" / "transformer"
    for pp in range(4):
        stage = target / "release" / f"mp_rank_00_{pp:03d}"
        stage.mkdir(parents=True)
        (stage / "model_optim_rng.pt").write_bytes(b"")
    (target / "latest_checkpointed_iteration.txt").write_text("release")
    return target


@pytest.fixture
def job(tmp_path: Path, ckpt: Path) -> Path:
    job = copy_job(tmp_path, "wan21_t2v")
    script = job / "pretrain.sh"
    sub(script, r'^LOAD_PATH=".*"$', f'LOAD_PATH="{ckpt}/"')
    sub(script, r"^PP=1$", "PP=4")
    return job


def test_expected_rank_dirs() -> None:
    assert expected_rank_dirs(1, 1) == {"mp_rank_00"}
    assert expected_rank_dirs(2, 2) == {
        "mp_rank_00_000",
        "mp_rank_00_001",
        "mp_rank_01_000",
        "mp_rank_01_001",
    }
    assert expected_rank_dirs(1, 1, 2) == {"mp_rank_00_000", "mp_rank_00_001"}


def test_matching_checkpoint_is_clean(job: Path) -> None:
    """Only the manifest warning: mm-convert records no split, so the layers per stage are unchecked."""
    report = run(job)
    assert report.ok
    found = [f for f in report.findings if f.rule.startswith(("ckpt.", "path.")) and f.field == "LOAD_PATH"]
    assert [(f.severity, f.rule) for f in found] == [("warning", "ckpt.manifest_missing")]


def test_rank_dirs_do_not_match_pp(job: Path) -> None:
    script = job / "pretrain.sh"
    f = assert_one(
        new_findings(job, lambda: sub(script, r"^PP=4$", "PP=1")),
        "ckpt.rank_dirs",
        "error",
        script,
        "LOAD_PATH",
    )
    assert "missing mp_rank_00" in f.message and "unexpected mp_rank_00_000" in f.message
    assert "re-convert" in f.fix


def test_extra_rank_dirs_only_warn(job: Path, ckpt: Path) -> None:
    f = assert_one(
        new_findings(job, lambda: (ckpt / "release" / "mp_rank_01_000").mkdir()),
        "ckpt.rank_dirs",
        "warning",
        job / "pretrain.sh",
        "LOAD_PATH",
    )
    assert "unexpected mp_rank_01_000" in f.message


def test_tracker_missing(job: Path, ckpt: Path) -> None:
    found = new_findings(job, lambda: (ckpt / "latest_checkpointed_iteration.txt").unlink())
    f = assert_one(found, "ckpt.tracker_missing", "error", job / "pretrain.sh", "LOAD_PATH")
    assert "silently train from random init" in f.message


def test_tracker_invalid(job: Path, ckpt: Path) -> None:
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    f = assert_one(
        new_findings(job, lambda: tracker.write_text("final\n")), "ckpt.tracker_invalid", "error", tracker
    )
    assert "Invalid metadata file" in f.message


def test_tracker_iteration_dir_missing(job: Path, ckpt: Path) -> None:
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    found = new_findings(job, lambda: tracker.write_text("5000"))
    f = assert_one(found, "ckpt.iter_dir_missing", "error", job / "pretrain.sh", "LOAD_PATH")
    assert "iter_0005000" in f.message


def test_tracker_iteration_ok(job: Path, ckpt: Path) -> None:
    def saved() -> None:
        (ckpt / "release").rename(ckpt / "iter_0005000")
        (ckpt / "latest_checkpointed_iteration.txt").write_text("5000\n")

    assert not new_findings(job, saved)


@pytest.mark.parametrize("inner", ["release", "release/", "iter_0000100"])
def test_load_path_points_inside_checkpoint(job: Path, ckpt: Path, inner: str) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r'^LOAD_PATH=".*"$', f'LOAD_PATH="{ckpt}/{inner}"'))
    f = assert_one(found, "ckpt.points_inside", "error", script, "LOAD_PATH")
    assert str(ckpt) in f.fix


def test_release_needs_no_load_flags(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^    --no-load-rng \\\n", ""))
    f = assert_one(found, "ckpt.release_needs_no_load", "error", script, "LOAD_PATH")
    assert "--no-load-rng" in f.fix and "--no-load-optim" not in f.fix


def test_load_path_missing_is_a_warning(job: Path, tmp_path: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r'^LOAD_PATH=".*"$', f'LOAD_PATH="{tmp_path}/nowhere"'))
    f = assert_one(found, "path.missing", "warning", script, "LOAD_PATH")
    lines = script.read_text().splitlines()
    assert f.line is not None and lines[f.line - 1].startswith("LOAD_PATH=")


def test_load_path_not_passed(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^    --load \$LOAD_PATH \\\n", ""))
    assert_one(found, "ckpt.load_not_passed", "warning", script, "LOAD_PATH")


def test_bridge_patch_accepts_hf_dir(job: Path, ckpt: Path) -> None:
    def hf_dir() -> None:
        (ckpt / "latest_checkpointed_iteration.txt").unlink()
        (ckpt / "diffusion_pytorch_model.safetensors").write_bytes(b"")
        model = job / "pretrain_model.json"
        sub(
            model,
            r'^    "task": "t2v",',
            '    "task": "t2v",\n    "patch": {"clip_grad_async": true, "bridge_patch": true},',
        )

    assert not new_findings(job, hf_dir)
