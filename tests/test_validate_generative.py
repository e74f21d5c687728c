"""Wan2.1 job rules: keys, scripts, feature extraction, datasets, num_frames, FSDP2; one defect per test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_validate_support import assert_one, copy_job, edit_json, new_findings, run, sub


@pytest.fixture
def job(tmp_path: Path) -> Path:
    return copy_job(tmp_path, "wan21_t2v")


# ---- keys ------------------------------------------------------------------------------------------------
def test_unknown_key_suggests_the_close_one(job: Path) -> None:
    model = job / "pretrain_model.json"

    def typo() -> None:
        edit_json(
            model,
            lambda d: d["predictor"].__setitem__(
                "pipline_num_layers", d["predictor"].pop("pipeline_num_layers")
            ),
        )

    f = assert_one(new_findings(job, typo), "keys.unknown", "warning", model, "predictor.pipline_num_layers")
    assert "did you mean 'pipeline_num_layers'" in f.message
    assert f.line is not None and '"pipline_num_layers"' in model.read_text().splitlines()[f.line - 1]


def test_required_key_missing(job: Path) -> None:
    data = job / "feature_data.json"
    found = new_findings(job, lambda: edit_json(data, lambda d: d["dataloader_param"].pop("dataloader_mode")))
    f = assert_one(found, "keys.required", "error", data, "dataloader_param.dataloader_mode")
    assert "Key parameter missing: dataloader_mode" in f.message


def test_required_predictor_key(job: Path) -> None:
    model = job / "pretrain_model.json"
    found = new_findings(job, lambda: edit_json(model, lambda d: d["predictor"].pop("num_heads")))
    assert_one(found, "keys.required", "error", model, "predictor.num_heads")


def test_section_of_wrong_type(job: Path) -> None:
    tools = job / "tools.json"
    found = new_findings(
        job, lambda: edit_json(tools, lambda d: d.__setitem__("sorafeature", "./sora_features"))
    )
    assert {(f.rule, f.field) for f in found} == {
        ("keys.type", "sorafeature"),
        ("fe.sorafeature", "sorafeature.save_path"),
    }


def test_duplicate_json_key(job: Path) -> None:
    tools = job / "tools.json"
    found = new_findings(
        job, lambda: sub(tools, r'^    "sorafeature"', '    "memory_profile": {},\n    "sorafeature"')
    )
    assert_one(found, "json.duplicate_key", "warning", tools, "memory_profile")


# ---- scripts ---------------------------------------------------------------------------------------------
def test_crlf_script(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: script.write_bytes(script.read_bytes().replace(b"\n", b"\r\n")))
    f = assert_one(found, "script.crlf", "error", script)
    assert f.line == 1 and "dos2unix" in f.fix


def test_script_syntax_error_with_line(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"^mkdir -p logs$", "if [ -d logs ]; then\nmkdir -p logs"))
    f = assert_one(found, "script.syntax", "error", script)
    assert f.line is not None


def test_config_referenced_by_script_missing(job: Path) -> None:
    script = job / "pretrain.sh"
    found = new_findings(job, lambda: sub(script, r"pretrain_model\.json", "nope.json"))
    f = assert_one(found, "config.missing", "error", script, "MM_MODEL")
    assert "One or more config files failed to load" in f.message


def test_swapped_configs(job: Path) -> None:
    script = job / "pretrain.sh"

    def swap() -> None:
        sub(script, r"^MM_DATA=.*$", 'MM_DATA="$JOB_DIR/pretrain_model.json"')
        sub(script, r"^MM_MODEL=.*$", 'MM_MODEL="$JOB_DIR/feature_data.json"')

    found = [f for f in new_findings(job, swap) if f.rule == "config.role_mismatch"]
    assert {(f.severity, f.field) for f in found} == {("error", "MM_DATA"), ("error", "MM_MODEL")}


# ---- feature extraction ---------------------------------------------------------------------------------
def test_data_folder_must_not_be_features_dir(job: Path) -> None:
    data = job / "feature_data.json"
    found = new_findings(
        job,
        lambda: edit_json(
            data,
            lambda d: d["dataset_param"]["basic_parameters"].update(data_folder="./sora_features/features/"),
        ),
    )
    f = assert_one(found, "feature.data_folder", "error", data, "dataset_param.basic_parameters.data_folder")
    assert "'./sora_features/'" in f.fix


def test_save_path_mismatch(job: Path) -> None:
    tools = job / "tools.json"
    found = new_findings(
        job, lambda: edit_json(tools, lambda d: d["sorafeature"].update(save_path="./other_features"))
    )
    assert {(f.severity, f.rule, f.field) for f in found} == {
        ("warning", "feature.save_path_mismatch", "dataset_param.basic_parameters.data_folder"),
        ("warning", "feature.save_path_mismatch", "dataset_param.basic_parameters.data_path"),
    }
    assert all(f.file == str((job / "feature_data.json").resolve()) for f in found)


def test_fe_data_needs_two_stage_pipeline(job: Path) -> None:
    data = job / "feature_extract" / "data.json"
    found = new_findings(
        job,
        lambda: edit_json(
            data, lambda d: d["dataset_param"]["preprocess_parameters"]["train_pipeline"].pop("video_only")
        ),
    )
    f = assert_one(
        found,
        "fe.train_pipeline",
        "error",
        data,
        "dataset_param.preprocess_parameters.train_pipeline.video_only",
    )
    assert "key not found in vid_img_process" in f.message


@pytest.mark.parametrize("script", ["get_vace_feature.py", "get_sora_feature.py", "get_hunyuan_feature.py"])
def test_two_stage_pipeline_only_for_scripts_that_read_it(job: Path, script: str) -> None:
    # upstream's get_vace/sora/hunyuan_feature.py never read video_only / video_and_first_frame (only
    # get_wan_feature.py does), so their data.json (the stock VACE one, for one) has no such keys
    sub(job / "feature_extract" / "feature_extraction.sh", r"get_wan_feature\.py", script)
    data = job / "feature_extract" / "data.json"

    def drop() -> None:
        edit_json(
            data, lambda d: d["dataset_param"]["preprocess_parameters"]["train_pipeline"].pop("video_only")
        )

    assert [f for f in new_findings(job, drop) if f.rule == "fe.train_pipeline"] == []


def test_tools_needs_sorafeature_for_extraction(job: Path) -> None:
    tools = job / "tools.json"
    found = new_findings(job, lambda: edit_json(tools, lambda d: d.pop("sorafeature")))
    f = assert_one(found, "fe.sorafeature", "error", tools, "sorafeature.save_path")
    assert "'ConfigReader' object has no attribute 'sorafeature'" in f.message


def test_feature_jsonl(tmp_path: Path, job: Path) -> None:
    mm = tmp_path / "mm"
    (mm / "sora_features" / "features").mkdir(parents=True)
    (mm / "sora_features" / "features" / "video0001_mp4.pt").write_bytes(b"x")
    jsonl = mm / "sora_features" / "data.jsonl"
    jsonl.write_text(
        json.dumps({"path": "/d/video0001.mp4", "cap": "a", "file": "features/video0001_mp4.pt"}) + "\n"
    )
    assert not [f for f in run(job, mm_root=mm).findings if f.rule.startswith("feature.")]

    found = new_findings(job, lambda: jsonl.write_text('{"path": "/d/v.mp4", "cap": "a"}\n'), mm_root=mm)
    assert_one(found, "feature.jsonl_record", "error", jsonl, "file")

    found = new_findings(job, lambda: jsonl.write_text('{"file": "features/gone_mp4.pt"}\n'), mm_root=mm)
    assert_one(found, "feature.file_missing", "warning", jsonl, "file")


def test_feature_data_path_missing_is_a_warning(tmp_path: Path, job: Path) -> None:
    report = run(job, mm_root=tmp_path / "mm")
    f = [
        f
        for f in report.findings
        if f.field == "dataset_param.basic_parameters.data_path" and f.file.endswith("feature_data.json")
    ]
    assert [(x.rule, x.severity) for x in f] == [("path.missing", "warning")]


# ---- num_frames ------------------------------------------------------------------------------------------
def test_wan_num_frames_is_4n_plus_1(job: Path) -> None:
    data = job / "feature_data.json"
    found = new_findings(
        job,
        lambda: edit_json(data, lambda d: d["dataset_param"]["preprocess_parameters"].update(num_frames=80)),
    )
    f = assert_one(found, "wan.num_frames", "error", data, "dataset_param.preprocess_parameters.num_frames")
    assert "77 or 81" in f.fix


def test_num_frames_ok_values(job: Path) -> None:
    data = job / "feature_data.json"
    assert not new_findings(
        job,
        lambda: edit_json(data, lambda d: d["dataset_param"]["preprocess_parameters"].update(num_frames=49)),
    )


# ---- data.txt and raw dataset ----------------------------------------------------------------------------
def _dataset(tmp_path: Path, records: list[dict[str, object]], videos: bool = True) -> tuple[Path, Path]:
    root = tmp_path / "dataset"
    (root / "videos").mkdir(parents=True)
    if videos:
        (root / "videos" / "video0001.mp4").write_bytes(b"")
    index = tmp_path / "data.json"
    index.write_text(json.dumps(records, indent=2))
    return root, index


GOOD = [{"path": "videos/video0001.mp4", "cap": "a cat", "num_frames": 81, "fps": 24}]


def test_data_txt_and_dataset_ok(tmp_path: Path, job: Path) -> None:
    root, index = _dataset(tmp_path, GOOD)
    (job / "feature_extract" / "data.txt").write_text(f"{root},{index}\n")
    report = run(job)
    assert not [f for f in report.findings if f.severity != "info" and "data" in Path(f.file).name]
    assert any(s.kind == "raw_dataset" for s in report.files)


def test_data_txt_line_without_comma(job: Path) -> None:
    txt = job / "feature_extract" / "data.txt"
    found = new_findings(job, lambda: txt.write_text("/data/wan2.1/data.json\n"))
    f = assert_one(found, "data_txt.format", "error", txt)
    assert f.line == 1


def test_data_txt_json_missing_when_root_exists(tmp_path: Path, job: Path) -> None:
    root, _ = _dataset(tmp_path, GOOD)
    txt = job / "feature_extract" / "data.txt"
    txt.write_text(f"{root},{tmp_path / 'data.json'}\n")
    found = new_findings(job, lambda: txt.write_text(f"{root},{tmp_path / 'missing.json'}\n"))
    assert_one(found, "data_txt.json_missing", "error", txt)


def test_dataset_records_need_path_and_cap(tmp_path: Path, job: Path) -> None:
    root, index = _dataset(tmp_path, GOOD)
    (job / "feature_extract" / "data.txt").write_text(f"{root},{index}\n")
    bad = [{"video": "videos/video0001.mp4", "caption": "a cat"}]
    found = new_findings(job, lambda: index.write_text(json.dumps(bad, indent=2)))
    f = assert_one(found, "dataset.keys", "error", index, "[0]")
    assert "video → path" in f.fix and "caption → cap" in f.fix
    assert f.line == 2


def test_dataset_video_missing(tmp_path: Path, job: Path) -> None:
    root, index = _dataset(tmp_path, GOOD)
    (job / "feature_extract" / "data.txt").write_text(f"{root},{index}\n")
    found = new_findings(job, lambda: (root / "videos" / "video0001.mp4").unlink())
    assert_one(found, "dataset.video_missing", "warning", index, "[0].path")


# ---- weights ---------------------------------------------------------------------------------------------
def test_from_pretrained_missing_is_a_warning(tmp_path: Path, job: Path) -> None:
    mm = tmp_path / "mm"
    vae = mm / "Wan2.1-T2V-1.3B-Diffusers" / "vae"
    report = run(job, mm_root=mm)
    model = str((job / "feature_extract" / "model_t2v.json").resolve())
    hits = [f for f in report.findings if f.file == model and f.field == "ae.from_pretrained"]
    assert [(f.rule, f.severity, f.line) for f in hits] == [("path.missing", "warning", 4)]
    vae.mkdir(parents=True)
    report = run(job, mm_root=mm)
    assert not [f for f in report.findings if f.file == model and f.field == "ae.from_pretrained"]


# ---- FSDP2 -----------------------------------------------------------------------------------------------
def _fsdp2(job: Path, *, connections: str = "2", untie: bool = True, config: bool = True) -> None:
    script = job / "pretrain.sh"
    flags = "    --use-torch-fsdp2 \\\n    --fsdp2-config-path $JOB_DIR/fsdp2_config.yaml \\\n"
    if untie:
        flags += "    --untie-embeddings-and-output-weights \\\n"
    sub(script, r"^    --bf16 \\\n", "    --bf16 \\\n" + flags.replace("\\", "\\\\"))
    sub(script, r"CUDA_DEVICE_MAX_CONNECTIONS=1", f"CUDA_DEVICE_MAX_CONNECTIONS={connections}")
    if config:
        (job / "fsdp2_config.yaml").write_text(
            "sharding_size: auto\nsub_modules_to_wrap:\n  - predictor.blocks.{*}\n  - predictor.head\n"
            "reshard_after_forward: True\nparam_dtype: bf16\nreduce_dtype: fp32\ncast_forward_inputs: True\n"
        )


def test_fsdp2_ok(job: Path) -> None:
    assert not new_findings(job, lambda: _fsdp2(job))
    kinds = {Path(s.path).name: s.kind for s in run(job).files}
    assert kinds["fsdp2_config.yaml"] == "fsdp2_config"


def test_fsdp2_needs_two_connections(job: Path) -> None:
    f = assert_one(
        new_findings(job, lambda: _fsdp2(job, connections="1")),
        "fsdp2.max_connections",
        "error",
        job / "pretrain.sh",
        "CUDA_DEVICE_MAX_CONNECTIONS",
    )
    assert f.line == 6


def test_fsdp2_without_untie(job: Path) -> None:
    assert_one(
        new_findings(job, lambda: _fsdp2(job, untie=False)),
        "fsdp2.untie",
        "warning",
        job / "pretrain.sh",
        "--use-torch-fsdp2",
    )


def test_fsdp2_config_missing(job: Path) -> None:
    assert_one(
        new_findings(job, lambda: _fsdp2(job, config=False)),
        "fsdp2.config_missing",
        "error",
        job / "pretrain.sh",
        "--fsdp2-config-path",
    )
