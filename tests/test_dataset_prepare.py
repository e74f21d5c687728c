"""`prepare_dataset` (issue 15) on real files: tiny H.264 clips written with PyAV, PNGs written with Pillow and
sidecar captions, through the core function, the MCP tool and the `mm-agent dataset` command. Every rejection
is asserted by its exact reason code and path; every write by the bytes on disk.

Clips are checked against a Wan 2.1 t2v job rendered for one NPU at 17 frames of 240x416: its extraction's
global batch size is 1, so MindSpeed-MM's final filter keeps a sample size shared by 4 clips (the stock job's
8 NPUs would need 32), and the tests use 4+ good clips where clips must be accepted."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client
from PIL import Image

from mm_agent.dataset import DatasetRequest, DatasetResult, prepare_dataset
from mm_agent.dataset import mllm as mllm_module
from mm_agent.dataset import prepare as prepare_module
from mm_agent.dataset.prepare import FIXES
from mm_agent.errors import MMAgentError
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server
from mm_agent.validate import ValidateRequest, validate_configs
from runtime.synth import write_mp4

GOOD = 6  # distinct 17-frame 240x416 clips
FLOOR = 4  # clips per sample size the one-NPU job's final filter keeps (4 x global batch size 1)
RECORD = {"num_frames": 17, "fps": 16.0, "resolution": {"height": 240, "width": 416}}
CONTRACT = {"ok", "written", "accepted", "rejected", "stats"}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clips c0..c5 (distinct bytes), a 32x32 clip and a PNG, generated once and copied into each test."""
    lib = tmp_path_factory.mktemp("media")
    ramp = np.arange(416, dtype=np.uint8)[None, None, :]
    for i in range(GOOD):
        frames = np.zeros((17, 240, 416, 3), np.uint8)
        frames[..., 0] = 40 * i
        frames[..., 1] = ramp
        write_mp4(lib / f"c{i}.mp4", frames, 16)
    write_mp4(lib / "small.mp4", np.full((17, 32, 32, 3), 90, np.uint8), 16)
    Image.new("RGB", (64, 48), (200, 30, 30)).save(lib / "red.png")
    Image.new("RGB", (64, 48), (30, 30, 200)).save(lib / "blue.png")
    return lib


def render_small_wan(
    ws: Path, out: str, dataset_dir: str = "dataset", dataset_file: str | None = None
) -> None:
    """Wan 2.1 t2v at 17 frames of 240x416 on one NPU (extraction GBS 1: 4 clips make a sample size)."""
    request = RenderRequest(
        model="wan2.1",
        task="t2v",
        out_dir=out,
        num_frames=17,
        max_height=240,
        max_width=416,
        npus_per_node=1,
        dataset_dir=dataset_dir,
        dataset_file=dataset_file,
        confirm=True,
    )
    render_job(request, root=ws)


@pytest.fixture(scope="module")
def small_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-NPU job, rendered once; `job` copies it into each test's workspace."""
    base = tmp_path_factory.mktemp("jobs")
    render_small_wan(base, "job")
    return base / "job"


@pytest.fixture
def job(ws: Path, small_job: Path) -> str:
    shutil.copytree(small_job, ws / "job")
    return "job"


def put(folder: Path, name: str, source: Path | bytes, caption: str | bytes | None = None) -> Path:
    """`folder/name` from a library file (or raw bytes), with `caption` as its sidecar .txt when given."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        path.write_bytes(source)
    else:
        shutil.copyfile(source, path)
    if caption is not None:
        text = path.with_suffix(".txt")
        text.write_bytes(caption if isinstance(caption, bytes) else caption.encode())
    return path


def good_folder(media: Path, folder: Path, count: int) -> list[str]:
    """`count` accepted clips clip0..clipN with captions; their relative paths."""
    for i in range(count):
        put(folder, f"clip{i}.mp4", media / f"c{i}.mp4", f"clip number {i}")
    return [f"clip{i}.mp4" for i in range(count)]


def tree(folder: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under `folder` (symlinks by their target text)."""
    out: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def prepare(ws: Path, **fields: Any) -> DatasetResult:
    """prepare_dataset confined to the workspace with one probe process (the test machine has two cores);
    Wan clips against the workspace's one-NPU `job` unless told otherwise."""
    fields.setdefault("model", "wan2.1")
    if fields["model"] == "wan2.1":
        fields.setdefault("job_dir", "job")
    return prepare_dataset(DatasetRequest(**fields), root=ws, workers=1)


def rejected(result: DatasetResult) -> dict[str, str]:
    return {r.path: r.reason for r in result.rejected}


def records(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, list)
    return data


def test_dry_run_rejects_each_defect_by_code_and_writes_nothing(ws: Path, media: Path, job: str) -> None:
    clips = ws / "clips"
    good_folder(media, clips, FLOOR)
    put(clips, "small.mp4", media / "small.mp4", "too small")
    put(clips, "nocap.mp4", media / "c2.mp4")
    put(clips, "corrupt.mp4", (media / "c3.mp4").read_bytes()[:1500], "cut off")
    put(clips, "empty.mp4", b"", "nothing")
    put(clips, "fake.mp4", media / "red.png", "a png")
    put(clips, "latin.mp4", media / "c4.mp4", "caf\xe9 au lait".encode("latin-1"))
    put(clips, "long.mp4", media / "c5.mp4", "word " * (13 * 1024 + 1))
    put(clips, "zdup.mp4", media / "c0.mp4", "same bytes as clip0")
    before = tree(ws)

    result = prepare(ws, dir="clips")

    codes = {
        "nocap.mp4": "no_caption",
        "corrupt.mp4": "unreadable",
        "empty.mp4": "empty",
        "fake.mp4": "mislabelled",
        "latin.mp4": "caption_not_utf8",
        "long.mp4": "caption_too_long",
        "zdup.mp4": "duplicate",
    }
    assert result.stats.reasons == {**{c: 1 for c in codes.values()}, "resolution_too_small": 1}
    assert set(rejected(result)) == {*codes, "small.mp4"}
    fixes = {r.path: r.fix for r in result.rejected}
    assert {path: fixes[path] for path in codes} == {path: FIXES[code] for path, code in codes.items()}
    assert "min_hxw 24960" in rejected(result)["small.mp4"]
    assert rejected(result)["zdup.mp4"] == "same bytes as clip0.mp4"
    assert "image data" in rejected(result)["fake.mp4"]
    assert (result.ok, result.accepted, result.stats.found, result.stats.duplicates) == (True, 4, 12, 1)
    assert result.written is None and result.plot is None
    assert result.index == str(clips / "data.json")
    assert tree(ws) == before


def test_confirm_writes_raw_index_list_file_and_plot_leaving_clips_untouched(
    ws: Path, media: Path, job: str
) -> None:
    clips = ws / "clips"
    put(clips, "b.mp4", media / "c1.mp4", "second clip")
    put(clips, "a.mp4", media / "c0.mp4", "  first clip\n")
    put(clips, "sub/c.mp4", media / "c2.mp4", "nested clip")
    put(clips, "sub/d.mp4", media / "c3.mp4", "nested too")
    put(clips, "empty.mp4", b"", "rejected")
    before = tree(clips)

    result = prepare(ws, dir="clips", confirm=True)

    index = clips / "data.json"
    assert (result.status, result.written, result.accepted) == ("written", str(index), 4)
    assert result.stats.reasons == {"empty": 1}
    assert records(index) == [
        {"path": "a.mp4", "cap": "first clip", **RECORD},
        {"path": "b.mp4", "cap": "second clip", **RECORD},
        {"path": "sub/c.mp4", "cap": "nested clip", **RECORD},
        {"path": "sub/d.mp4", "cap": "nested too", **RECORD},
    ]
    assert (clips / "data.txt").read_text() == f"{clips},{index}\n"
    assert result.data_txt == str(clips / "data.txt")
    assert result.plot == str(clips / "data.stats.png")
    assert (clips / "data.stats.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    after = tree(clips)
    assert set(after) - set(before) == {"data.json", "data.txt", "data.stats.png"}
    assert {k: after[k] for k in before} == before


def test_rerun_uses_the_probe_cache_and_reprobes_only_a_touched_clip(ws: Path, media: Path, job: str) -> None:
    clips = ws / "clips"
    names = good_folder(media, clips, FLOOR)
    put(clips, "empty.mp4", b"", "rejected, and cached too")
    first = prepare(ws, dir="clips", confirm=True)
    index = clips / "data.json"
    written = index.read_bytes()
    stamp = index.stat().st_mtime_ns
    assert (first.status, first.stats.probed, first.stats.cached) == ("written", 5, 0)

    again = prepare(ws, dir="clips", confirm=True)
    assert (again.status, again.stats.probed, again.stats.cached) == ("unchanged", 0, 5)
    assert again.stats.reasons == {"empty": 1}
    assert index.read_bytes() == written and index.stat().st_mtime_ns == stamp  # not rewritten

    clip = clips / names[1]
    os.utime(clip, ns=(clip.stat().st_atime_ns, clip.stat().st_mtime_ns + 5_000_000_000))
    touched = prepare(ws, dir="clips")
    assert (touched.stats.probed, touched.stats.cached, touched.accepted) == (1, 4, 4)


def test_a_data_json_not_written_by_mm_agent_is_never_overwritten(ws: Path, media: Path, job: str) -> None:
    clips = ws / "clips"
    names = good_folder(media, clips, FLOOR)
    mine = clips / "data.json"
    mine.write_text('[{"path": "mine.mp4", "cap": "hand written"}]\n')
    before = tree(clips)

    with pytest.raises(MMAgentError) as refused:
        prepare(ws, dir="clips", confirm=True)
    assert refused.value.field == "out"
    assert "was not written by mm-agent" in str(refused.value)
    assert refused.value.fix is not None and "out" in refused.value.fix
    assert tree(clips) == before

    elsewhere = prepare(ws, dir="clips", out="index/clips.json", confirm=True)
    assert elsewhere.written == str(ws / "index" / "clips.json")
    assert [r["path"] for r in records(ws / "index" / "clips.json")] == names
    assert (ws / "index" / "data.txt").read_text() == f"{clips},{ws / 'index' / 'clips.json'}\n"
    assert tree(clips) == before


def interrupt_at(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """Ctrl-C arrives while the scan checks its `nth` probed item (after its probe is cached)."""
    check = prepare_module._Run.check_probe
    calls = 0

    def interrupted(run: Any, item: Any, probe: dict[str, Any]) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth:
            raise KeyboardInterrupt
        return check(run, item, probe)

    monkeypatch.setattr(prepare_module._Run, "check_probe", interrupted)


def test_a_scan_killed_midway_leaves_no_index_and_its_probes_are_reused(
    ws: Path, media: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clips = ws / "clips"
    good_folder(media, clips, 5)
    before = tree(clips)
    check = prepare_module._Run.check_probe
    interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        prepare(ws, dir="clips", confirm=True)
    assert tree(clips) == before  # no data.json, data.txt, plot, nor a leftover .data.json.<pid>.tmp
    assert not [p for p in clips.iterdir() if p.name.endswith(".tmp")]

    monkeypatch.setattr(prepare_module._Run, "check_probe", check)
    result = prepare(ws, dir="clips", confirm=True)
    assert (result.stats.cached, result.stats.probed, result.accepted) == (3, 2, 5)
    assert [r["path"] for r in records(clips / "data.json")] == [f"clip{i}.mp4" for i in range(5)]


def test_an_interrupted_scan_stops_its_probe_processes(
    ws: Path, media: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP server lives on after a failed call (a full disk while writing the index, or any exception in
    the scan): the call's probe processes must not."""
    good_folder(media, ws / "clips", 2)
    interrupt_at(monkeypatch, 1)
    running = set(multiprocessing.active_children())
    with pytest.raises(KeyboardInterrupt):
        prepare(ws, dir="clips", confirm=True)
    assert set(multiprocessing.active_children()) <= running


def test_an_interrupted_vlm_scan_stops_its_probe_processes(
    ws: Path, media: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(ws / "vlm", "images/red.png", media / "red.png")
    chat = [{"from": "human", "value": "<image>What color?"}, {"from": "gpt", "value": "Red."}]
    (ws / "vlm" / "chat.json").write_text(json.dumps([{"image": "images/red.png", "conversations": chat}]))

    def interrupted(text: str) -> tuple[int, int]:
        raise KeyboardInterrupt  # while the first probed record is counted

    monkeypatch.setattr(mllm_module, "placeholders", interrupted)
    running = set(multiprocessing.active_children())
    with pytest.raises(KeyboardInterrupt):
        prepare(ws, dir="vlm", model="qwen2.5vl", index="vlm/chat.json", confirm=True)
    assert set(multiprocessing.active_children()) <= running
    assert sorted(p.name for p in (ws / "vlm").iterdir()) == ["chat.json", "images"]


def test_symlink_loop_and_link_out_of_the_workspace(ws: Path, media: Path, tmp_path: Path, job: str) -> None:
    clips = ws / "clips"
    good_folder(media, clips, FLOOR)
    (clips / "loop").symlink_to(clips, target_is_directory=True)
    (clips / "sub").mkdir()
    (clips / "sub" / "back").symlink_to("..", target_is_directory=True)
    outside = put(tmp_path / "outside", "o.mp4", media / "c4.mp4", "outside")
    (clips / "o.mp4").symlink_to(outside)
    (clips / "o.txt").write_text("linked out of the workspace")

    result = prepare(ws, dir="clips")
    assert result.accepted == FLOOR and result.stats.found == FLOOR + 1
    assert result.stats.reasons == {"outside_roots": 1}
    assert [r.path for r in result.rejected] == ["o.mp4"]
    assert result.rejected[0].fix == FIXES["outside_roots"]

    with pytest.raises(MMAgentError) as refused:
        prepare(ws, dir=str(tmp_path / "outside"))
    assert refused.value.field == "dir" and "outside" in str(refused.value)


def test_a_caption_linked_out_of_the_workspace_or_a_fifo_caption_is_not_read(
    ws: Path, media: Path, tmp_path: Path, job: str
) -> None:
    clips = ws / "clips"
    good_folder(media, clips, FLOOR)
    secret = tmp_path / "secret.txt"
    secret.write_text("a secret outside the workspace")
    put(clips, "linked.mp4", media / "c4.mp4")
    (clips / "linked.txt").symlink_to(secret)
    put(clips, "piped.mp4", media / "c4.mp4")
    os.mkfifo(clips / "piped.txt")  # opening it would block the scan for good

    result = prepare(ws, dir="clips")
    assert result.stats.reasons == {"outside_roots": 1, "caption_unreadable": 1}
    assert sorted(rejected(result)) == ["linked.mp4", "piped.mp4"]
    assert "secret" not in result.model_dump_json()
    assert result.accepted == FLOOR


def test_index_files_csv_detected_and_jsonl_named_columns(ws: Path, media: Path, job: str) -> None:
    clips = ws / "clips"
    put(clips, "a.mp4", media / "c0.mp4")
    put(clips, "b.mp4", media / "c1.mp4")
    put(clips, "sub/c.mp4", media / "c2.mp4")
    put(clips, "d.mp4", media / "c3.mp4")
    rows = "a.mp4,a red clip\nb.mp4,a blue clip\ngone.mp4,lost\nsub/c.mp4,nested\nd.mp4,last\n"
    (clips / "list.csv").write_text("video,caption\n" + rows)

    result = prepare(ws, dir="clips", index="clips/list.csv", confirm=True)
    assert result.accepted == 4 and result.stats.reasons == {"missing": 1}
    assert [r.path for r in result.rejected] == ["gone.mp4"]
    assert "list.csv:3" in result.rejected[0].reason and result.rejected[0].fix == FIXES["missing"]
    assert records(clips / "data.json") == [  # the index's order
        {"path": "a.mp4", "cap": "a red clip", **RECORD},
        {"path": "b.mp4", "cap": "a blue clip", **RECORD},
        {"path": "sub/c.mp4", "cap": "nested", **RECORD},
        {"path": "d.mp4", "cap": "last", **RECORD},
    ]

    lines = [
        {"clip_file": name, "summary": f"clip {name}"} for name in ("d.mp4", "b.mp4", "a.mp4", "sub/c.mp4")
    ]
    (clips / "list.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    named = prepare(
        ws, dir="clips", index="clips/list.jsonl", path_column="clip_file", caption_column="summary"
    )
    assert (named.accepted, named.rejected, named.stats.cached) == (4, [], 4)


def test_cli_index_path_is_relative_to_the_working_directory_like_out(
    ws: Path, media: Path, job: str
) -> None:
    """Without a workspace root (the CLI), `out` and `job_dir` start at the working directory, and so must
    `index`: `mm-agent dataset clips --index clips/list.csv` is what tab completion types (and what the MCP
    tool takes, relative to the workspace)."""
    clips = ws / "clips"
    names = good_folder(media, clips, FLOOR)
    (clips / "list.csv").write_text("video,caption\n" + "".join(f"{name},a clip\n" for name in names))
    result = prepare_dataset(DatasetRequest(dir="clips", model="wan2.1", job_dir=job, index="clips/list.csv"))
    assert result.accepted == FLOOR


def test_limits_come_from_the_job_and_validate_accepts_the_written_index(
    ws: Path, media: Path, job: str
) -> None:
    clips = ws / "clips"
    good_folder(media, clips, FLOOR)

    result = prepare(ws, dir="clips", job_dir=job, confirm=True)
    assert result.limits["num_frames"] == 17 and result.limits["global_batch_size"] == 1
    assert result.limits["source"] == str(ws / "job" / "feature_extract" / "data.json")
    assert (result.accepted, result.warnings) == (FLOOR, [])
    assert result.stats.sample_sizes == {"17x240x416": FLOOR}

    render_small_wan(ws, "job2", dataset_dir=str(clips), dataset_file=str(clips / "data.json"))
    report = validate_configs(ValidateRequest(paths=["job2"]), root=ws)
    assert [f for f in report.findings if f.rule.startswith("dataset.") and f.severity == "error"] == []


def test_vlm_records_are_written_in_the_models_attr_shape(ws: Path, media: Path) -> None:
    vlm = ws / "vlm"
    put(vlm, "images/red.png", media / "red.png")
    put(vlm, "images/blue.png", media / "blue.png")

    def chat(question: str) -> list[dict[str, str]]:
        return [{"from": "human", "value": question}, {"from": "gpt", "value": "Red."}]

    both = ["images/red.png", "images/blue.png"]
    llava = [
        {"image": "images/red.png", "conversations": chat("<image>\nWhat color?")},
        {"image": both, "conversations": chat("Compare them.")},
        {"image": "images/gone.png", "conversations": chat("<image>\nAnd this?")},
        {"image": both, "conversations": chat("<image> only one placeholder")},
    ]
    (vlm / "chat.json").write_text(json.dumps(llava))

    result = prepare(ws, dir="vlm", model="qwen2.5vl", index="vlm/chat.json", confirm=True)
    assert (result.kind, result.accepted, result.data_txt) == ("mllm", 2, None)
    assert result.stats.reasons == {"missing": 1, "image_placeholders": 1}
    assert sorted(r.path for r in result.rejected) == ["chat.json:3", "chat.json:4"]
    assert records(vlm / "data.json") == [
        {
            "messages": [
                {"role": "user", "content": "<image>\nWhat color?"},
                {"role": "assistant", "content": "Red."},
            ],
            "images": ["images/red.png"],
        },
        {
            "messages": [
                {"role": "user", "content": "<image><image>Compare them."},
                {"role": "assistant", "content": "Red."},
            ],
            "images": both,
        },
    ]

    with pytest.raises(MMAgentError) as refused:
        prepare(ws, dir="vlm", model="qwen2.5vl")
    assert refused.value.field == "index"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_tool_flat_arguments_brief_answer_and_refusals(ws: Path, media: Path, job: str) -> None:
    clips = ws / "clips"
    names = good_folder(media, clips, FLOOR)
    for i in range(30):
        put(clips, f"nocap{i:02}.mp4", b"")  # no sidecar: rejected before any probe
    async with Client(build_server(ws), raise_exceptions=True) as client:
        args = {"dir": "clips", "model": "wan2.1", "job_dir": job}
        dry = await client.call_tool("prepare_dataset", args)
        assert not dry.is_error
        brief = dry.structured_content
        assert brief is not None
        text = "".join(getattr(c, "text", "") for c in dry.content)
        assert len(text) < 4_000 and f"{FLOOR} accepted, 30 rejected" in text and "no_caption 30" in text
        assert len(brief["rejected"]) == 10 and brief["rejected_more"] == 20
        assert (
            brief["status"] == "dry_run" and brief["written"] is None
        )  # the contract key, null on a dry run
        assert brief["stats"]["reasons"] == {"no_caption": 30}
        assert len(json.dumps(brief, separators=(",", ":"))) < 8_000
        assert not (clips / "data.json").exists()

        full = await client.call_tool("prepare_dataset", {**args, "detail": True})
        assert full.structured_content is not None
        assert (
            len(full.structured_content["rejected"]) == 30 and "rejected_more" not in full.structured_content
        )

        written = await client.call_tool("prepare_dataset", {**args, "confirm": True})
        assert written.structured_content is not None
        assert written.structured_content["status"] == "written"
        assert written.structured_content["written"] == str(clips / "data.json")
        assert [r["path"] for r in records(clips / "data.json")] == names

        outside = await client.call_tool("prepare_dataset", {**args, "dir": str(ws.parent)})
        message = "".join(getattr(c, "text", "") for c in outside.content)
        assert outside.is_error and "dir" in message and f"the workspace {ws.resolve()}" in message

        unknown = await client.call_tool("prepare_dataset", {**args, "frames": 17})
        assert unknown.is_error


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MM_AGENT_STATE_DIR": os.environ["MM_AGENT_STATE_DIR"]}
    command = [sys.executable, "-m", "mm_agent", "dataset", *args, "--model", "wan2.1", "--job", "job"]
    return subprocess.run(command, cwd=ws, env=env, capture_output=True, text=True, timeout=120)


def test_cli_json_contract_exit_codes_and_flag_errors(ws: Path, media: Path, job: str) -> None:
    clips = ws / "clips"
    names = good_folder(media, clips, FLOOR)
    put(clips, "empty.mp4", b"", "nothing")
    put(ws / "bad", "empty.mp4", b"", "nothing")

    dry = cli(ws, "clips", "--json", "--workers", "1")
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert set(out) >= CONTRACT and out["written"] is None and out["accepted"] == FLOOR
    assert out["rejected"] == [{"path": "empty.mp4", "reason": "empty file (0 bytes)", "fix": FIXES["empty"]}]
    assert out["stats"]["reasons"] == {"empty": 1}
    assert not (clips / "data.json").exists()

    nothing = cli(ws, "bad", "--json", "--workers", "1")
    assert nothing.returncode == 1 and json.loads(nothing.stdout)["ok"] is False

    wrote = cli(ws, "clips", "--json", "--yes", "--workers", "1")
    assert wrote.returncode == 0 and json.loads(wrote.stdout)["written"] == str(clips / "data.json")
    assert [r["path"] for r in records(clips / "data.json")] == names

    bad = cli(ws, "clips", "--num-frames", "0")
    assert bad.returncode == 2 and "--num-frames" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stdout == ""
