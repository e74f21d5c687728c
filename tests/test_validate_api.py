"""validate_configs API: clean fixtures, classification, sorting, strictness, root confinement, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_validate_support import FIXTURES, copy_job, errors, run

from mm_agent.errors import MMAgentError
from mm_agent.validate import ValidateRequest, validate_configs


@pytest.mark.parametrize("job", ["wan21_t2v", "qwen25vl_3b", "qwen3vl_8b"])
def test_clean_fixture_has_no_errors(job: str) -> None:
    report = run(FIXTURES / job)
    assert report.ok, [(f.rule, f.file, f.message) for f in errors(report)]
    assert report.error_count == 0
    assert report.warning_count == sum(f.severity == "warning" for f in report.findings)


def test_files_are_classified_by_content() -> None:
    report = run(FIXTURES / "wan21_t2v")
    kinds = {Path(s.path).relative_to(FIXTURES / "wan21_t2v").as_posix(): s.kind for s in report.files}
    assert kinds == {
        "pretrain.sh": "shell",
        "feature_data.json": "feature_data",
        "pretrain_model.json": "sora_model",
        "tools.json": "tools",
        "feature_extract/data.json": "fe_data",
        "feature_extract/model_t2v.json": "fe_model",
        "feature_extract/data.txt": "data_txt",
        "feature_extract/feature_extraction.sh": "shell",
    }
    vlm = {Path(s.path).name: s.kind for s in run(FIXTURES / "qwen25vl_3b").files}
    assert vlm == {"data.json": "vlm_data", "model.json": "vlm_model", "finetune_qwen2_5_vl_3b.sh": "shell"}


def test_referenced_configs_are_validated_when_only_the_script_is_given() -> None:
    report = run(FIXTURES / "wan21_t2v" / "pretrain.sh")
    names = {Path(s.path).name for s in report.files}
    assert names == {"pretrain.sh", "feature_data.json", "pretrain_model.json", "tools.json"}


def test_findings_sorted_by_file_and_line(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "wan21_t2v")
    report = run(job, mm_root=tmp_path)
    keys = [(f.file, f.line or 0) for f in report.findings]
    assert keys == sorted(keys)
    assert len(report.findings) > 3


def test_strict_counts_warnings_as_errors(tmp_path: Path) -> None:
    report = run(FIXTURES / "wan21_t2v")
    assert report.ok and report.warning_count > 0
    assert not run(FIXTURES / "wan21_t2v", strict=True).ok


def test_paths_outside_root_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MMAgentError, match="outside the workspace"):
        validate_configs(ValidateRequest(paths=[str(FIXTURES / "wan21_t2v")]), root=tmp_path)
    with pytest.raises(MMAgentError, match="no paths"):
        validate_configs(ValidateRequest(paths=[]))


def test_referenced_paths_outside_root_are_not_read(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "wan21_t2v")
    report = validate_configs(ValidateRequest(paths=[str(job)]), root=job)
    outside = [f for f in report.findings if f.rule == "path.outside_workspace"]
    assert outside and all(f.severity == "info" for f in outside)
    assert any("/data/wan2.1/dataset" in f.message for f in outside)
    assert report.ok


def test_relative_request_paths_resolve_against_root(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "qwen25vl_3b")
    report = validate_configs(ValidateRequest(paths=["qwen25vl_3b"]), root=tmp_path)
    assert {Path(s.path).parent for s in report.files} == {job.resolve()}


def test_missing_input_is_a_finding(tmp_path: Path) -> None:
    report = run(tmp_path / "nope")
    assert [(f.rule, f.severity) for f in report.findings] == [("input.missing", "error")]
    assert not report.ok


@pytest.mark.parametrize(
    ("name", "payload", "rule"),
    [
        ("model.json", b"\xff\xfe{\x00\x00junk", "file.binary"),
        ("model.json", b'{"a": "\xe9t\xe9"}', "file.encoding"),
        ("data.yaml", b"a: [1,\n  b: }\n", "yaml.syntax"),
        ("model.json", b'{"predictor": {"num_layers": 30,}}', "json.syntax"),
        ("run.sh", b"#!/bin/bash\nif true; then\n  echo hi\n", "script.syntax"),
    ],
)
def test_bad_input_becomes_findings(tmp_path: Path, name: str, payload: bytes, rule: str) -> None:
    (tmp_path / name).write_bytes(payload)
    report = run(tmp_path / name)
    assert [f.rule for f in errors(report)] == [rule]
    assert errors(report)[0].line is not None
    assert errors(report)[0].fix


def test_json_syntax_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text('{\n  "predictor": {\n    "num_layers": 30,\n  }\n}\n')
    (finding,) = errors(run(path))
    assert finding.rule == "json.syntax" and finding.line == 4


def test_random_bytes_never_raise(tmp_path: Path) -> None:
    import random

    rng = random.Random(7)
    for i in range(40):
        suffix = (".json", ".yaml", ".sh", ".txt")[i % 4]
        name = "data.txt" if suffix == ".txt" else f"f{i}{suffix}"
        (tmp_path / name).write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(200))))
        run(tmp_path / name)
    run(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text("{}")
    path.chmod(0)
    try:
        assert [f.rule for f in errors(run(path))] == ["file.unreadable"]
    finally:
        path.chmod(0o644)


def test_job_yaml_is_ignored_by_rules(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "qwen25vl_3b")
    (job / "job.yaml").write_text("model: qwen2.5vl\ntask: sft\nwhatever: [1, 2]\n")
    report = run(job)
    assert {s.kind for s in report.files if s.path.endswith("job.yaml")} == {"job_yaml"}
    assert not [f for f in report.findings if f.file.endswith("job.yaml")]


def test_mm_root_from_job_yaml(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "qwen25vl_3b")
    (job / "job.yaml").write_text(f"mm_root: {tmp_path / 'mm'}\n")
    report = run(job)
    missing = {f.field for f in report.findings if f.rule == "path.missing"}
    assert "dataset_param.preprocess_parameters.model_name_or_path" in missing


def test_relative_paths_without_mm_root_are_not_checked() -> None:
    """Plain paths are noted (info); a config the script passes whose run-time location cannot be known
    (no cd, not next to the script, no MindSpeed-MM root) is a warning naming the cross-file checks lost."""
    report = run(FIXTURES / "qwen25vl_3b")
    unresolved = {f.field for f in report.findings if f.rule == "path.unresolved"}
    assert {"dataset_param.preprocess_parameters.model_name_or_path"} <= unresolved
    skipped = {f.field: f for f in report.findings if f.severity != "info"}
    assert set(skipped) == {"MM_TOOL", "LOAD_PATH"}, report.findings
    assert all((f.rule, f.severity) == ("crossfile.skipped", "warning") for f in skipped.values())
    assert (
        "does not cd" in skipped["MM_TOOL"].message and "skipped: tool settings" in skipped["MM_TOOL"].message
    )
    assert "skipped: the checkpoint tracker" in skipped["LOAD_PATH"].message


def test_script_without_launch_is_noted(tmp_path: Path) -> None:
    script = tmp_path / "prepare.sh"
    script.write_text("#!/bin/bash\nset -e\nmkdir -p data\n")
    report = run(script)
    assert [(f.rule, f.severity) for f in report.findings] == [("script.no_launch", "info")]


def test_too_large_file_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mm_agent.validate import files

    monkeypatch.setattr(files, "MAX_BYTES", 10)
    path = tmp_path / "model.json"
    path.write_text('{"predictor": {}}')
    report = run(path)
    assert [(f.rule, f.severity) for f in report.findings] == [("file.too_large", "warning")]


def test_fsdp2_without_connections_setting_warns(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "qwen3vl_8b")
    script = job / "finetune_qwen3vl_8B.sh"
    script.write_text(script.read_text().replace("export CUDA_DEVICE_MAX_CONNECTIONS=2", ""))
    hits = [f for f in run(job).findings if f.rule == "fsdp2.max_connections"]
    assert [(f.severity, f.field) for f in hits] == [("warning", "CUDA_DEVICE_MAX_CONNECTIONS")]


def test_delegated_script_is_followed(tmp_path: Path) -> None:
    job = copy_job(tmp_path, "wan21_t2v")
    (job / "pretrain.sh").rename(job / "inner.sh")
    wrapper = job / "launch.sh"
    wrapper.write_text(
        '#!/bin/bash\nJOB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        'bash "$JOB_DIR/inner.sh" "$@"\n'
    )
    report = run(wrapper)
    assert {Path(s.path).name for s in report.files} >= {"launch.sh", "inner.sh", "pretrain_model.json"}
    assert not [f for f in report.findings if f.rule == "script.no_launch"]
    (job / "inner.sh").unlink()
    (hit,) = [f for f in run(wrapper).findings if f.rule == "script.no_launch"]
    assert hit.severity == "info" and hit.line == 3 and "inner.sh" in hit.message
