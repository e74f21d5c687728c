"""`validate_configs` holds a job's dataset against its own configs (issue 15): rendered Wan 2.1 t2v and
Qwen2.5-VL sft jobs, each given a dataset with one defect, report exactly the rule that names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_validate_support import edit_json, sub

from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import Finding, ValidateRequest, validate_configs

# Wan 2.1 t2v's extraction config: 81 frames, max_hxw 480x832 (min_hxw a quarter of it), aspect within 5:1;
# its script runs 8 ranks with MBS 1, so GBS is 8 and a sample size needs 4 x 8 = 32 clips.
FLOOR = 32
CLIP = {
    "path": "clips/c.mp4",
    "cap": "a cat",
    "num_frames": 81,
    "fps": 16.0,
    "resolution": {"height": 480, "width": 832},
}
CHAT = {
    "messages": [
        {"role": "user", "content": "<image>What is this?"},
        {"role": "assistant", "content": "A cat."},
    ],
    "images": ["images/cat.jpg"],
}


def _clip(**change: Any) -> dict[str, Any]:
    record = json.loads(json.dumps(CLIP))
    for key, value in change.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    return record


def _render(ws: Path, model: str, task: str, out: str = "job", **options: Any) -> Path:
    render_job(RenderRequest(model=model, task=task, out_dir=out, confirm=True, **options), root=ws)
    return ws / out


def _validate(ws: Path, job: Path) -> list[Finding]:
    return validate_configs(ValidateRequest(paths=[str(job)]), root=ws).findings


def _ours(findings: list[Finding]) -> list[tuple[str, str, str, str | None]]:
    """(severity, rule, file name, field) of the dataset and MLLM findings, in report order."""
    return [
        (f.severity, f.rule, Path(f.file).name, f.field)
        for f in findings
        if f.rule.startswith(("dataset.", "vlm.")) and f.severity != "info"
    ]


@pytest.fixture
def wan(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    job = _render(ws, "wan2.1", "t2v")
    (ws / "dataset" / "clips").mkdir(parents=True)
    (ws / "dataset" / "clips" / "c.mp4").write_bytes(b"")
    return job


def _clips(job: Path, records: list[dict[str, Any]]) -> list[Finding]:
    ws = job.parent
    (ws / "dataset" / "data.json").write_text(json.dumps(records, indent=2))
    return _validate(ws, job)


def test_job_without_its_dataset_gains_no_findings(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for model, task in (("wan2.1", "t2v"), ("qwen2.5vl", "sft")):
        found = _validate(ws, _render(ws, model, task, model))
        assert not [f for f in found if f.rule.startswith("dataset.") or f.severity == "error"], found


def test_clean_clips_validate_clean(wan: Path) -> None:
    found = _clips(wan, [CLIP] * FLOOR)
    assert not _ours(found), found
    assert not [f for f in found if f.severity == "error"]


def test_missing_metadata_is_an_error_naming_the_fix(wan: Path) -> None:
    records = [CLIP] * FLOOR + [_clip(fps=None), _clip(resolution=None, num_frames=None)]
    found = _clips(wan, records)
    assert _ours(found) == [("error", "dataset.metadata_missing", "data.json", f"[{FLOOR}]")]
    f = found[[x.rule for x in found].index("dataset.metadata_missing")]
    assert "2 of 34 records" in f.message and "silently drops" in f.message and "no fps" in f.message
    # with the job: its own limits, not the stock ones (which could refuse clips the job takes)
    assert f"mm-agent dataset {wan.parent / 'dataset'} --model wan2.1 --job {wan.resolve()} --yes" in f.fix
    assert f.line is not None


def test_duration_stands_in_for_num_frames(wan: Path) -> None:
    assert not _ours(_clips(wan, [_clip(num_frames=None, duration=5.0625)] * FLOOR))


def test_refusals_are_warnings_per_reason_with_three_examples(wan: Path) -> None:
    narrow = _clip(resolution={"height": 150, "width": 1000})
    small = _clip(resolution={"height": 240, "width": 320})
    found = _clips(wan, [CLIP] * FLOOR + [narrow] * 5 + [small])
    assert _ours(found) == [
        ("warning", "dataset.clip_refused", "data.json", f"[{FLOOR}]"),
        ("warning", "dataset.clip_refused", "data.json", f"[{FLOOR + 5}]"),
    ]
    aspect, tiny = (f for f in found if f.rule == "dataset.clip_refused")
    assert "5 of 38 records are left out" in aspect.message and "(aspect_mismatch)" in aspect.message
    assert aspect.message.count("record ") == 3  # examples capped, the count is not
    assert "hw_aspect_thr" in aspect.fix
    assert "(resolution_too_small)" in tiny.message and "min_hxw 99840" in tiny.message


def test_unknown_extension_is_an_error(wan: Path) -> None:
    found = _clips(wan, [CLIP] * FLOOR + [_clip(path="clips/c.gif")])
    assert ("error", "dataset.clip_refused", "data.json", f"[{FLOOR}]") in _ours(found)
    assert any("Unknown file extension" in f.message for f in found)


def test_every_clip_dropped_is_an_error(wan: Path) -> None:
    found = _clips(wan, [_clip(resolution={"height": 240, "width": 320})] * 3)
    assert _ours(found) == [
        ("error", "dataset.all_dropped", "data.json", None),
        ("warning", "dataset.clip_refused", "data.json", "[0]"),
    ]
    assert "not enough values to unpack" in next(f for f in found if f.rule == "dataset.all_dropped").message


def test_small_sample_size_groups_warn_with_the_floor(wan: Path) -> None:
    hd = _clip(resolution={"height": 720, "width": 1280})  # scaled under max_hxw: trains at 472x840
    found = _clips(wan, [CLIP] * FLOOR + [hd] * 5)
    assert _ours(found) == [("warning", "dataset.small_groups", "data.json", None)]
    f = next(f for f in found if f.rule == "dataset.small_groups")
    assert "81x472x840: 5" in f.message and f"global batch size 8 = {FLOOR}" in f.message
    assert "feature_extraction.sh" in f.fix


def test_only_small_groups_means_nothing_is_left(wan: Path) -> None:
    found = _clips(wan, [CLIP] * 5)
    assert _ours(found) == [("error", "dataset.all_dropped", "data.json", None)]
    dropped = next(f for f in found if f.rule == "dataset.all_dropped")
    assert "81x480x832: 5" in dropped.message
    assert f"--model wan2.1 --job {wan.resolve()}` shows which clips are kept" in dropped.fix


def test_global_batch_size_is_read_from_the_extraction_script(wan: Path) -> None:
    sub(wan / "feature_extract" / "feature_extraction.sh", r"^GBS=.*$", "GBS=1")
    assert not _ours(_clips(wan, [CLIP] * 5))  # floor 4 x 1


def test_num_frames_off_4n1_is_reported_once(wan: Path) -> None:
    edit_json(
        wan / "feature_extract" / "data.json",
        lambda d: d["dataset_param"]["preprocess_parameters"].update(num_frames=80),
    )
    found = _clips(wan, [CLIP] * FLOOR)
    assert [f.rule for f in found if f.rule.endswith("num_frames")] == ["wan.num_frames"]


def test_num_frames_rule_for_other_opensoraplan_models(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    job = _render(ws, "opensoraplan1.3", "t2v")
    data = job / "feature_extract" / "data.json"
    edit_json(data, lambda d: d["dataset_param"]["preprocess_parameters"].update(num_frames=47))
    found = [f for f in _validate(ws, job) if f.rule == "dataset.num_frames"]
    assert [(f.severity, f.field) for f in found] == [
        ("error", "dataset_param.preprocess_parameters.num_frames")
    ]
    assert found[0].fix == "set num_frames to 45 or 49"


def test_bundled_runtime_is_not_judged_by_mindspeed_mm_s_filter(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    job = _render(ws, "wan2.1", "t2v", runtime="bundled")
    (ws / "dataset" / "clips").mkdir(parents=True)
    (ws / "dataset" / "clips" / "c.mp4").write_bytes(b"")
    assert not _ours(_clips(job, [_clip(fps=None)] * 3))


# ---- MLLM -------------------------------------------------------------------------------------------------
@pytest.fixture
def qwen(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    job = _render(ws, "qwen2.5vl", "sft")
    (ws / "dataset" / "images").mkdir(parents=True)
    (ws / "dataset" / "images" / "cat.jpg").write_bytes(b"")
    return job


def _chats(job: Path, records: list[Any], name: str = "data.json") -> list[Finding]:
    ws = job.parent
    path = ws / "dataset" / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        edit_json(
            job / "data.json", lambda d: d["dataset_param"]["basic_parameters"].update(dataset=str(path))
        )
    else:
        path.write_text(json.dumps(records, indent=2))
    return _validate(ws, job)


def _chat(messages: list[tuple[str, str]], images: list[str] | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"messages": [{"role": r, "content": c} for r, c in messages]}
    if images is not None:
        record["images"] = images
    return record


def test_clean_conversations_validate_clean(qwen: Path) -> None:
    text_only = _chat([("user", "Hi"), ("assistant", "Hello.")])
    found = _chats(qwen, [CHAT, text_only])
    assert not _ours(found), found


@pytest.mark.parametrize("name", ["data.json", "data.jsonl"])
def test_turns_mindspeed_mm_skips(qwen: Path, name: str) -> None:
    twice = _chat([("user", "Hi"), ("user", "Hi?"), ("assistant", "Hello.")])
    unanswered = _chat([("user", "Hi")])
    found = _chats(qwen, [CHAT, twice, unanswered], name)
    assert _ours(found) == [("warning", "dataset.vlm_turns", name, "[1]")]
    f = next(f for f in found if f.rule == "dataset.vlm_turns")
    assert "2 of the first 3 records" in f.message and "'Invalid role tag'" in f.message
    assert "end each conversation with the assistant's answer" in f.fix


def test_a_system_turn_first_is_fine(qwen: Path) -> None:
    edit_json(qwen / "data.json", lambda d: d["dataset_param"]["attr"].update(system_tag="system"))
    assert not _ours(_chats(qwen, [_chat([("system", "Be brief."), ("user", "Hi"), ("assistant", "Yo")])]))


def test_missing_image_files_warn(qwen: Path) -> None:
    dog = _chat([("user", "<image>And this?"), ("assistant", "A dog.")], ["images/dog.jpg"])
    found = _chats(qwen, [CHAT, dog])
    assert _ours(found) == [("warning", "dataset.image_missing", "data.json", "[1].images")]
    f = next(f for f in found if f.rule == "dataset.image_missing")
    assert "1 of 2 image files" in f.message and "'images/dog.jpg'" in f.message
    assert str(qwen.parent / "dataset") in f.fix


def test_absolute_image_paths_are_found(qwen: Path) -> None:
    absolute = _chat(
        [("user", "<image>?"), ("assistant", "A cat.")], [str(qwen.parent / "dataset/images/cat.jpg")]
    )
    assert not _ours(_chats(qwen, [absolute]))


# The record checks rules_vlm already makes (issue 15's attr keys, roles and <image> counts): each defect is
# reported once, by that rule, and the turn and image checks above do not add a second finding for it.
@pytest.mark.parametrize(
    ("record", "rule", "field"),
    [
        (
            _chat([("user", "<image><image>Two?"), ("assistant", "One.")], ["images/cat.jpg"]),
            "vlm.image_tokens",
            "[0]",
        ),
        (_chat([("user", "Hi"), ("assistant", "Yo")], ["images/cat.jpg"]), "vlm.image_tokens", "[0]"),
        (
            {"conversations": CHAT["messages"], "images": ["images/cat.jpg"]},
            "vlm.attr_mismatch",
            "dataset_param.attr.messages",
        ),
        (_chat([("human", "Hi"), ("gpt", "Yo")]), "vlm.attr_mismatch", "dataset_param.attr.user_tag"),
        (
            {"messages": [{"from": "user", "content": "Hi"}, {"from": "assistant", "content": "Yo"}]},
            "vlm.attr_mismatch",
            "dataset_param.attr.role_tag",
        ),
    ],
)
def test_record_defects_are_reported_once(qwen: Path, record: dict[str, Any], rule: str, field: str) -> None:
    found = [(severity, rule, field) for severity, rule, _, field in _ours(_chats(qwen, [record]))]
    assert found == [("error", rule, field)], found


def test_images_under_a_null_attr_images(qwen: Path) -> None:
    edit_json(qwen / "data.json", lambda d: d["dataset_param"]["attr"].update(images=None))
    found = _ours(_chats(qwen, [CHAT]))
    assert ("error", "vlm.attr_mismatch", "data.json", "dataset_param.attr.images") in found
    assert not [f for f in found if f[1].startswith("dataset.")]
