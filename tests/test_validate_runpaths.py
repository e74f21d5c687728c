"""Config paths are resolved where the script will be at run time (issue 13): relative to the directory it
`cd`s into before the launch, or, when it does not cd, next to the script (the job manager runs it from
there). Cross-file checks then run on those files; when the location truly cannot be known, a warning says
which cross-file checks were skipped. `mm_root` over MCP is confined like every other path."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_validate_support import copy_job, run, sub

from mm_agent.errors import MMAgentError
from mm_agent.validate import ValidateRequest, validate_configs


def _relative_model(job: Path) -> Path:
    """Move the model config into t2v/ and name it relative, as a hand-written job does; CP=8 does not
    divide the 12 heads of Wan2.1 1.3B, a defect only the cross-file check sees."""
    (job / "t2v").mkdir()
    model = (job / "pretrain_model.json").rename(job / "t2v" / "pretrain_model.json")
    sub(job / "pretrain.sh", r"^MM_MODEL=.*$", 'MM_MODEL="./t2v/pretrain_model.json"')
    sub(job / "pretrain.sh", r"^CP=1$", "CP=8")
    sub(job / "pretrain.sh", r"^LOAD_PATH=.*$", 'LOAD_PATH="$JOB_DIR/ckpt"')  # only the model is relative
    return model


def _heads(report_findings: list, model: Path) -> list:
    return [f for f in report_findings if f.rule == "parallel.heads_divisible" and f.file == str(model)]


def test_a_script_that_does_not_cd_finds_its_config_next_to_it(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "wan21_t2v")
    model = _relative_model(job)
    report = run(job)
    (found,) = _heads(report.findings, model.resolve())
    assert found.severity == "error" and "CP=8" in found.message
    assert not [f for f in report.findings if f.rule == "crossfile.skipped"]


def test_a_script_that_cds_into_mm_root_finds_its_config_there(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "wan21_t2v")
    sub(job / "pretrain.sh", r"^LOAD_PATH=.*$", 'LOAD_PATH="$JOB_DIR/ckpt"')
    mm = tmp_path / "MindSpeed-MM"
    (mm / "examples" / "wan").mkdir(parents=True)
    model = (job / "pretrain_model.json").rename(mm / "examples" / "wan" / "model.json")
    sub(job / "pretrain.sh", r"^MM_MODEL=.*$", 'MM_MODEL="examples/wan/model.json"')
    sub(job / "pretrain.sh", r"^CP=1$", "CP=8")
    # a decoy with the same relative name next to the script: the cd decides, not the script's folder
    (job / "examples" / "wan").mkdir(parents=True)
    (job / "examples" / "wan" / "model.json").write_text("{}\n", encoding="utf-8")
    sub(job / "pretrain.sh", r"^(NPUS_PER_NODE=8)$", f'\\1\nMM_ROOT="{mm}"\ncd "$MM_ROOT"')
    report = run(job)
    (found,) = _heads(report.findings, model.resolve())
    assert found.severity == "error"
    # the same through an explicit mm_root, with the script's MM_ROOT pointing elsewhere
    sub(job / "pretrain.sh", r"^MM_ROOT=.*$", 'MM_ROOT="/opt/elsewhere"')
    assert _heads(run(job, mm_root=mm).findings, model.resolve())


def test_unknown_run_time_directory_is_a_warning_naming_the_skipped_checks(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "wan21_t2v")
    _relative_model(job)
    sub(job / "pretrain.sh", r"^(NPUS_PER_NODE=8)$", '\\1\ncd "$(cat /etc/mm_root_dir)"')
    report = run(job)
    skipped = [f for f in report.findings if f.rule == "crossfile.skipped"]
    assert [(f.severity, f.field) for f in skipped] == [("warning", "MM_MODEL")], skipped
    assert "CP/TP vs attention heads" in skipped[0].message and "cd's (line" in skipped[0].message
    assert not [f for f in report.findings if f.rule == "parallel.heads_divisible"]


def test_mm_root_over_mcp_is_confined_to_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    job = copy_job(ws, "wan21_t2v")
    outside = tmp_path / "MindSpeed-MM"
    (outside / "mindspeed_mm").mkdir(parents=True)
    for raw in (str(outside), "../MindSpeed-MM"):
        with pytest.raises(MMAgentError) as err:
            validate_configs(ValidateRequest(paths=[str(job)], mm_root=raw), root=ws)
        assert err.value.field == "mm_root" and "outside" in err.value.message
    # inside the workspace but not a MindSpeed-MM checkout: noted, nothing is run
    (ws / "mm").mkdir()
    report = validate_configs(ValidateRequest(paths=[str(job)], mm_root="mm"), root=ws)
    (note,) = [f for f in report.findings if f.rule == "mmparser.not_checkout"]
    assert note.severity == "info" and note.field == "mm_root"


def test_a_relative_load_path_is_checked_where_the_script_runs(tmp_path: Path) -> None:
    """LOAD_PATH next to a script that does not cd: the checkpoint checks run on it (no tracker: the
    'silently trains from random init' error); with a cd into an unknown directory they are skipped, said."""
    job = copy_job(tmp_path, "wan21_t2v")
    sub(job / "pretrain.sh", r"^LOAD_PATH=.*$", 'LOAD_PATH="./ckpt"')
    (job / "ckpt").mkdir()
    found = [f for f in run(job).findings if f.field == "LOAD_PATH"]
    assert [(f.rule, f.severity) for f in found] == [("ckpt.tracker_missing", "error")], found
    sub(job / "pretrain.sh", r"^(NPUS_PER_NODE=8)$", '\\1\ncd "$(cat /etc/mm_root_dir)"')
    found = [f for f in run(job).findings if f.field == "LOAD_PATH"]
    assert [(f.rule, f.severity) for f in found] == [("crossfile.skipped", "warning")], found
    assert "TP/PP/VPP stage layout" in found[0].message


def test_paths_inside_a_config_resolve_where_the_launch_runs(tmp_path: Path) -> None:
    """A config's own relative paths (`from_pretrained`, `data_path`, `data_folder`) are opened by the training
    process, so they resolve in the directory the launch `cd`s into, not in the MindSpeed-MM root."""
    job = copy_job(tmp_path, "wan21_t2v")
    mm = tmp_path / "MindSpeed-MM"
    mm.mkdir()
    data = str((job / "feature_data.json").resolve())
    tokenizer = "Wan2.1-T2V-1.3B-Diffusers/tokenizer"

    def missing() -> dict[str | None, str]:
        report = run(job, mm_root=mm)
        return {f.field: f.message for f in report.findings if f.rule == "path.missing" and f.file == data}

    # the script cds into its own folder; the tokenizer and features are there, not in the MindSpeed-MM root
    sub(job / "pretrain.sh", r"^(NPUS_PER_NODE=8)$", '\\1\ncd "$JOB_DIR"')
    (job / tokenizer).mkdir(parents=True)
    (job / "sora_features").mkdir()
    (job / "sora_features" / "data.jsonl").write_text("", encoding="utf-8")
    assert missing() == {}
    # the same names only under the MindSpeed-MM root: missing where the run will look
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sub(job / "pretrain.sh", r'^cd "\$JOB_DIR"$', f'cd "{elsewhere}"')
    (mm / tokenizer).mkdir(parents=True)
    found = missing()
    assert str(elsewhere / tokenizer) in found["dataset_param.tokenizer_config[0].from_pretrained"]
    assert str(elsewhere / "sora_features") in found["dataset_param.basic_parameters.data_folder"]
