"""Each model's dataset reader decides the format (issue 26): `registry/data/dataset_formats.yaml` answers for every
registered job, `prepare_dataset` writes what that reader reads (CogVideoX and Step-Video: a data.jsonl of
`{file, captions}`), `render_job` points the job's data config at it, and `validate_configs` checks records against
the reader's keys and warns where MindSpeed-MM's multi-rank feature extraction repeats, drops or merges samples.

Real files throughout: H.264 clips written with PyAV, jobs rendered by `render_job`, findings from
`validate_configs`. What MindSpeed-MM's own readers make of the written files is tests/fidelity/test_dataset_readers.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mm_agent.dataset import DatasetRequest, DatasetResult, prepare_dataset
from mm_agent.dataset.formats import load_formats, reader_format
from mm_agent.dataset.limits import ClipLimits, ClipPlan, Refusal, plan_clip
from mm_agent.errors import MMAgentError
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import Finding, ValidateRequest, validate_configs
from runtime.synth import write_mp4

REPORTED = ("26.0.0", "26.1.0")


def _jobs() -> list[tuple[str, str, str, str]]:
    """(model, task, backend, version) of every registered job at every registry version where it exists."""
    reg = get_registry()
    out = []
    for entry in reg.models.values():
        for task in entry.tasks:
            for version in reg.versions.ids:
                if entry.versions.contains(version) and task.versions.contains(version):
                    out.append((entry.id, task.id, task.backend, version))
    return out


def test_every_registered_job_has_exactly_one_reader_answer() -> None:
    table = load_formats()
    reg = get_registry()
    ambiguous, missing = [], []
    for model, task, backend, version in _jobs():
        found = [
            e
            for e in table.models.get(model, ())
            if task in e.tasks and e.versions.contains(version) and (not e.backends or backend in e.backends)
        ]
        (missing if not found else ambiguous if len(found) > 1 else []).append(
            (model, task, backend, version)
        )
    assert not missing, f"jobs with no reader in dataset_formats.yaml: {missing[:8]}"
    assert not ambiguous, f"jobs with two readers: {ambiguous[:8]}"
    for model, entries in table.models.items():
        assert model in reg.models, f"dataset_formats.yaml names {model!r}, which is not registered"
        tasks = {t.id for t in reg.models[model].tasks}
        for entry in entries:
            assert set(entry.tasks) <= tasks, (model, entry.tasks, tasks)
    # the two models, at the release that has them
    for model in ("cogvideox", "stepvideo"):
        answer = reader_format(model, "t2v", "26.0.0")
        assert answer.format is not None and (answer.format.path_key, answer.format.caption_key) == (
            "file",
            "captions",
        )
        assert answer.index == "data.jsonl"
    assert reader_format("wan2.1", "t2v", "26.1.0").index == "data.json"
    assert reader_format("vace", "v2v", "26.1.0").format is None  # marked, with its fix
    assert {v for *_, v in _jobs()} >= set(REPORTED)


def _render(ws: Path, model: str, task: str, out: str, **options: Any) -> Path:
    render_job(RenderRequest(model=model, task=task, out_dir=out, confirm=True, **options), root=ws)
    return ws / out


def _basic(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["dataset_param"]["basic_parameters"]  # type: ignore[no-any-return]


def test_render_points_each_data_config_at_the_file_its_reader_reads(ws: Path) -> None:
    cog = _render(ws, "cogvideox", "t2v", "cog", size="1.5", mm_version="26.0.0")
    assert _basic(cog / "data.json") == {
        "data_path": str(ws / "dataset" / "data.jsonl"),
        "data_folder": str(ws / "dataset"),
        "data_storage_mode": "standard",
    }
    step = _render(ws, "stepvideo", "i2v", "step", mm_version="26.0.0")
    assert _basic(step / "feature_extract" / "data.json")["data_path"] == str(ws / "dataset" / "data.jsonl")
    wan = _render(ws, "wan2.1", "t2v", "wan")
    assert _basic(wan / "feature_extract" / "data.json")["data_storage_mode"] == "combine"
    assert (
        (wan / "feature_extract" / "data.txt").read_text().strip().endswith(str(ws / "dataset" / "data.json"))
    )
    named = _render(ws, "cogvideox", "lora", "named", mm_version="26.0.0", dataset_file="mine/clips.jsonl")
    # the user's choice wins
    assert _basic(named / "data.json")["data_path"] == str(ws / "mine" / "clips.jsonl")


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clips for CogVideoX 1.0 t2v (17 frames at train_fps 8, skip_frame_num 3): two good ones, a 5 fps clip
    whose resampling step is 0, an 18-frame 8 fps clip whose window runs past its end, one without caption."""
    lib = tmp_path_factory.mktemp("clips")
    rng = np.random.default_rng(5)
    for name, frames, fps, caption in (
        ("videos/a/one.mp4", 9, 16, "a red square"),
        ("videos/b/two.mp4", 40, 8, "a blue circle"),
        ("videos/slow.mp4", 100, 5, "too slow"),
        ("videos/short.mp4", 18, 8, "runs out"),
        ("videos/nocap.mp4", 9, 16, None),
    ):
        write_mp4(lib / name, rng.integers(0, 255, (frames, 32, 48, 3), dtype=np.uint8), fps)
        if caption is not None:
            (lib / name).with_suffix(".txt").write_text(caption)
    return lib


def _prepare(ws: Path, **fields: Any) -> DatasetResult:
    return prepare_dataset(DatasetRequest(**fields), root=ws, workers=1)


def test_prepare_writes_the_file_captions_jsonl_cogvideox_reads(ws: Path, clips: Path) -> None:
    import shutil

    shutil.copytree(clips, ws / "dataset")
    result = _prepare(ws, dir="dataset", model="cogvideox", task="t2v", mm_version="26.0.0", confirm=True)
    assert result.written == str(ws / "dataset" / "data.jsonl") and result.data_txt is None
    lines = (ws / "dataset" / "data.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"file": "videos/a/one.mp4", "captions": "a red square"},
        {"file": "videos/b/two.mp4", "captions": "a blue circle"},
    ]
    assert result.stats.reasons == {"low_fps": 1, "too_short": 1, "no_caption": 1}, result.rejected
    assert result.reader is not None and "T2VDataset" in result.reader and "data.jsonl" in result.reader
    assert any("--dataset-file" in s and s.endswith("jobs/cogvideox-t2v") for s in result.next_steps)
    # the job it renders reads that file, and validate finds nothing wrong with its records
    job = _render(ws, "cogvideox", "t2v", "job", mm_version="26.0.0")
    assert _basic(job / "data.json")["data_path"] == result.written
    found = validate_configs(ValidateRequest(paths=[str(job)]), root=ws).findings
    assert not [f for f in found if f.rule.startswith(("dataset.", "extract."))], found
    # Step-Video reads the same layout (its feature extraction config), through its rendered job; at its 136
    # frames and skip_frame_num 0 the 18-frame clip is padded, not refused
    _render(ws, "stepvideo", "t2v", "step", mm_version="26.0.0", npus_per_node=2, tp=1)
    again = _prepare(
        ws, dir="dataset", model="stepvideo", job_dir="step", out="dataset/step.jsonl", confirm=True
    )
    assert [json.loads(x)["file"] for x in (ws / "dataset" / "step.jsonl").read_text().splitlines()] == [
        "videos/a/one.mp4",
        "videos/b/two.mp4",
        "videos/short.mp4",
    ]
    assert again.stats.reasons == {"low_fps": 1, "no_caption": 1}
    # 3 samples on its 2 extraction ranks: the stock SequentialSampler with drop_last leaves the third out
    assert [w for w in again.warnings if "drops the last 1" in w and "FileNotFoundError" in w], again.warnings


def test_cogvideox_clip_decisions() -> None:
    """The decisions CogVideoXProcessor makes at load (judged against MindSpeed-MM's own processor in
    tests/fidelity/test_dataset_readers.py)."""
    lim = ClipLimits(processor="CogVideoXProcessor", num_frames=17, train_fps=8, skip_frame_num=3)
    assert isinstance(plan_clip(9, 16, 32, 48, lim), ClipPlan)  # short: padded with its last frame
    assert isinstance(plan_clip(52, 24, 32, 48, lim), ClipPlan)  # resampled, every 3rd frame up to frame 51
    low = plan_clip(100, 5, 32, 48, lim)
    assert isinstance(low, Refusal) and low.code == "low_fps"
    past = plan_clip(19, 8, 32, 48, lim)
    assert isinstance(past, Refusal) and past.code == "too_short" and "at least 20 frames" in past.fix
    none_left = plan_clip(6, 16, 32, 48, lim)
    assert isinstance(none_left, Refusal) and none_left.code == "too_short"


def test_prepare_refuses_a_reader_it_does_not_write_for_with_the_fix(ws: Path) -> None:
    (ws / "dataset").mkdir()
    with pytest.raises(MMAgentError) as refused:
        _prepare(ws, dir="dataset", model="vace", task="v2v")
    assert "src_video" in refused.value.message and refused.value.fix
    assert refused.value.fix == load_formats().models["vace"][0].unsupported.fix  # type: ignore[union-attr]


def test_prepare_reads_the_vlm_attr_from_a_yaml_training_config(ws: Path) -> None:
    """Qwen3-VL's job is a transformers YAML (data.dataset_param.attr): its records are MLLM conversations,
    where the JSON-only lookup refused the model."""
    from PIL import Image

    (ws / "dataset" / "images").mkdir(parents=True)
    Image.new("RGB", (32, 32), (200, 30, 30)).save(ws / "dataset" / "images" / "red.png")
    chat = [{"from": "human", "value": "<image>\nWhat color?"}, {"from": "gpt", "value": "Red."}]
    (ws / "chat.json").write_text(json.dumps([{"image": "images/red.png", "conversations": chat}]))
    result = _prepare(ws, dir="dataset", model="qwen3vl", task="sft", index="chat.json", confirm=True)
    assert (result.kind, result.accepted, result.written) == ("mllm", 1, str(ws / "dataset" / "data.json"))
    assert result.reader is not None and "get_qwen2vl_dataset" in result.reader
    assert json.loads((ws / "dataset" / "data.json").read_text()) == [
        {
            "messages": [
                {"role": "user", "content": "<image>\nWhat color?"},
                {"role": "assistant", "content": "Red."},
            ],
            "images": ["images/red.png"],
        }
    ]


def _findings(ws: Path, job: Path, *prefixes: str) -> list[Finding]:
    found = validate_configs(ValidateRequest(paths=[str(job)]), root=ws).findings
    return [f for f in found if f.rule.startswith(prefixes)]


def test_validate_checks_standard_records_against_the_readers_keys(ws: Path) -> None:
    data = ws / "dataset"
    (data / "videos").mkdir(parents=True)
    (data / "videos" / "a.mp4").write_bytes(b"")
    (data / "data.jsonl").write_text(
        '{"path": "videos/a.mp4", "cap": "a Wan-style record"}\n'
        '{"file": "videos/a.mp4"}\n'
        '{"file": "videos/gone.mp4", "captions": "missing clip"}\n'
    )
    job = _render(ws, "cogvideox", "t2v", "job", mm_version="26.0.0")
    found = {f.rule + ":" + f.severity: f for f in _findings(ws, job, "dataset.")}
    keys = found["dataset.keys:error"]
    assert (Path(keys.file).name, keys.field, keys.line) == ("data.jsonl", "[0]", 1)
    assert "KeyError: 'file'" in keys.message and "path → file, cap → captions" in (keys.fix or "")
    caps = found["dataset.keys:warning"]
    assert (caps.field, caps.line) == ("[1]", 2) and "random other record" in caps.message
    gone = found["dataset.video_missing:warning"]
    assert (gone.field, gone.line) == ("[2].file", 3)
    # the file the old render pointed CogVideoX at: a Wan-style data.json list, now an error naming the rename
    (data / "data.json").write_text(json.dumps([{"path": "videos/a.mp4", "cap": "x"}]))
    old = _render(ws, "cogvideox", "t2v", "old", mm_version="26.0.0", dataset_file="dataset/data.json")
    wan_style = [f for f in _findings(ws, old, "dataset.") if f.severity == "error"]
    assert [(f.rule, Path(f.file).name, f.field) for f in wan_style] == [("dataset.keys", "data.json", "[0]")]
    # a JSON list in a .jsonl: MindSpeed-MM reads it line by line
    (data / "data.jsonl").write_text('[{"file": "videos/a.mp4", "captions": "x"}]\n')
    listed = _findings(ws, job, "dataset.")
    assert [(f.rule, f.line) for f in listed] == [("dataset.jsonl", 1)] and ".json" in (listed[0].fix or "")


def _wan_records(count: int, *, same_name: bool = False) -> list[dict[str, Any]]:
    return [
        {
            "path": f"clips/{i}/clip.mp4" if same_name else f"clips/c{i}.mp4",
            "cap": "a clip",
            "num_frames": 81,
            "fps": 16.0,
            "resolution": {"height": 480, "width": 832},
        }
        for i in range(count)
    ]


def test_validate_says_what_mindspeed_mm_extraction_does_with_an_uneven_split(ws: Path) -> None:
    """Upstream's samplers on DP ranks x MBS (tests/fidelity/test_dataset_readers.py runs them): LengthGroupedSampler
    repeats samples to fill the last step, SequentialSampler with drop_last leaves the last ones out; file names
    alone name the features."""
    data = ws / "dataset"
    data.mkdir()
    # extraction GBS 2: a sample size needs 8 clips
    job = _render(ws, "wan2.1", "t2v", "wan", npus_per_node=2)
    (data / "data.json").write_text(json.dumps(_wan_records(9)))
    found = _findings(ws, job, "extract.")
    assert [(f.rule, f.severity) for f in found] == [("extract.duplicate_writes", "warning")]
    assert "add 1 or drop 1" in (found[0].fix or "") and "byte-identical" in found[0].message
    (data / "data.json").write_text(json.dumps(_wan_records(10)))
    assert _findings(ws, job, "extract.") == []
    (data / "data.json").write_text(json.dumps(_wan_records(10, same_name=True)))
    clash = _findings(ws, job, "extract.")
    assert [f.rule for f in clash] == ["extract.name_collision"] and "clip_mp4.pt" in clash[0].message
    # Step-Video extracts with the SequentialSampler and drop_last: 3 samples on 2 ranks lose the third
    (data / "data.jsonl").write_text(
        "".join(json.dumps({"file": f"clips/s{i}.mp4", "captions": "c"}) + "\n" for i in range(3))
    )
    step = _render(ws, "stepvideo", "t2v", "step", mm_version="26.0.0", npus_per_node=2, tp=1)
    dropped = _findings(ws, step, "extract.")
    assert [(f.rule, f.severity) for f in dropped] == [("extract.samples_dropped", "error")]
    assert "FileNotFoundError" in dropped[0].message and "add 1 or drop 1" in (dropped[0].fix or "")


def test_omni_records_carry_the_audios_key_its_reader_reads(ws: Path) -> None:
    """Qwen2.5-Omni's attr names `audios`: MindSpeed-MM's converter reads it from every record (KeyError without
    it, found by feeding the written file to the real converter in tests/fidelity/test_dataset_readers.py)."""
    (ws / "dataset" / "videos").mkdir(parents=True)
    write_mp4(ws / "dataset" / "videos" / "a.mp4", np.full((9, 64, 64, 3), 80, np.uint8), 16)
    chat = [{"from": "human", "value": "<video>\nWhat is it?"}, {"from": "gpt", "value": "Grey."}]
    (ws / "chat.json").write_text(json.dumps([{"video": "videos/a.mp4", "conversations": chat}]))
    job = _render(ws, "qwen2.5omni", "sft", "job")
    result = _prepare(ws, dir="dataset", model="qwen2.5omni", job_dir="job", index="chat.json", confirm=True)
    written = json.loads((ws / "dataset" / "data.json").read_text())
    assert result.accepted == 1 and written[0]["audios"] == [] and written[0]["videos"] == ["videos/a.mp4"]
    assert not [f for f in _findings(ws, job, "vlm.") if f.severity == "error"]
    del written[0]["audios"]
    (ws / "dataset" / "data.json").write_text(json.dumps(written))
    missing = [f for f in _findings(ws, job, "vlm.") if f.severity == "error"]
    assert [(f.rule, f.field) for f in missing] == [("vlm.attr_mismatch", "dataset_param.attr.audios")]
    assert "KeyError: 'audios'" in missing[0].message


def test_prepare_step_is_a_command_the_cli_takes_or_the_marked_fix() -> None:
    from mm_agent.cli import build_parser
    from mm_agent.dataset.formats import prepare_step

    argv, line = prepare_step("stepvideo", "i2v", "26.0.0", "dataset")
    assert argv is not None and "data.jsonl records {file, captions}" in line
    parsed = build_parser().parse_args(argv[1:])
    assert (parsed.model, parsed.task, parsed.mm_version, parsed.yes) == ("stepvideo", "i2v", "26.0.0", True)
    none, why = prepare_step("stepvideo", "dpo", "26.0.0", "dataset")
    assert none is None and "histogram_generator.py" in why
