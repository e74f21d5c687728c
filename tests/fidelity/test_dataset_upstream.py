"""MindSpeed-MM's own dataset code judges mm-agent's clip decisions and the indexes `prepare_dataset` writes.

`mm_agent.dataset.limits` is mm-agent's reading of `OpensoraplanVideoProcessor.select_valid_data`; here the real
thing (v26.0.0 and v26.1.0, through `upstream_dataset.py`, one child process per version) decides on the same
clips:

(a) a grid of clip descriptions (frame counts around the 4n+1 steps and num_frames, frame rates around train_fps,
    sizes from 4x4 to 4K with extreme aspect ratios), written as a raw `data.json` + `data.txt` and read by
    `DataFileReader` in combine mode, judged under the stock extraction config of Wan2.1, variants of it
    (auto_interval at 24 and 16 fps, drop_short_ratio 1, forced resolution, stride 32 / stride_t 8) and the stock
    Wan2.1 training, Wan2.2 and HunyuanVideo-1.5 configs (which leave keys out: the processor's own defaults
    apply), at global batch sizes where the final sample-size filter keeps some groups and drops others:
    MindSpeed-MM keeps exactly the clips `plan_clip` accepts minus the groups `small_groups` names, each at
    `plan_clip`'s `sample_size`, for the reasons `plan_clip` gives; where the filter would leave nothing,
    MindSpeed-MM fails;
(b) real mp4s in nested folders, indexed by hand with paths relative to the dataset root: DataFileReader joins
    every path onto an existing file and MindSpeed-MM's `DecordVideo` reads the frame count and fps written;
(c) `prepare_dataset` end to end on a folder with a keepable group of good clips, a good clip alone at its size, a
    too-small clip, a clip without caption sidecar and a corrupt file: the written data.txt, read by MindSpeed-MM
    under the limits the result reports, resolves to decodable files and keeps exactly the accepted clips.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mm_agent.dataset.limits import ClipLimits, ClipPlan, Refusal, limits_from_config, plan_clip, small_groups
from runtime.synth import write_mp4
from tests.fidelity.conftest import MMTrees

pytest.importorskip("torch")
pytest.importorskip("decord")
pytest.importorskip("av")

HERE = Path(__file__).resolve().parent
VERSIONS = ("26.0.0", "26.1.0")
# Only modules MindSpeed-MM's files import off the dataset path and this environment lacks are stubbed.
STUBBED = {"orjson", "ftfy", "torchvision", "pandas", "bs4", "scipy"}

FRAMES = (1, 2, 4, 5, 6, 17, 28, 29, 33, 80, 81, 82, 85, 100, 161, 1000)
FPS = (8, 12, 16, 23.976, 24, 24.05, 25, 29.97, 30, 59.94, 60, 120)
SIZES = (  # (height, width)
    (480, 832),
    (832, 480),
    (720, 1280),
    (1080, 1920),
    (2160, 3840),
    (720, 960),
    (960, 720),
    (481, 833),
    (333, 999),
    (316, 316),
    (315, 317),
    (100, 100),
    (4, 4),
    (7, 900),
    (90, 1999),
    (200, 1100),
    (1100, 200),
    (240, 1200),
    (320, 1600),
    (1600, 320),
)
# Sizes no other clip shares, 1, 2, 3 and 5 times: small groups for the final filter at any global batch size.
RARE = [(81, 24, 408, 720)] + [(85, 30, 416, 736)] * 2 + [(100, 25, 424, 752)] * 3 + [(161, 24, 432, 768)] * 5
WAN_EXTRACT = "examples/wan2.1/feature_extract/data.json"
# name -> (stock config in the MindSpeed-MM tree, preprocess_parameters overrides, global batch sizes)
VARIANTS: dict[str, tuple[str, dict[str, Any], tuple[int, ...]]] = {
    "wan2.1-extract": (WAN_EXTRACT, {}, (1, 8)),
    "wan2.1-extract-auto24": (WAN_EXTRACT, {"auto_interval": True}, (2,)),
    "wan2.1-extract-auto16": (WAN_EXTRACT, {"auto_interval": True, "train_fps": 16}, (2,)),
    "wan2.1-extract-drop-short": (WAN_EXTRACT, {"drop_short_ratio": 1.0}, (1,)),
    "wan2.1-extract-forced": (WAN_EXTRACT, {"force_resolution": True, "hw_aspect_thr": 1.5}, (32,)),
    "wan2.1-extract-stride32": (
        WAN_EXTRACT,
        {
            "hw_stride": 32,
            "hw_aspect_thr": 0,
            "num_frames": 93,
            "min_num_frames": 29,
            "vae_scale_factor": [8, 8, 8],
        },
        (4,),
    ),
    "wan2.1-train": ("examples/wan2.1/1.3b/t2v/feature_data.json", {}, (1,)),
    "wan2.2-5b": ("examples/wan2.2/5B/t2v/data.json", {}, (1,)),
    "hunyuanvideo1.5": ("examples/hunyuanvideo_1.5/t2v/data.json", {}, (1,)),
}
NOTHING_LEFT_GBS = 10**6  # every sample_size group is smaller than 4 x this
# MindSpeed-MM's DataStats counter -> plan_clip's refusal code (it counts a size under the stride apart).
COUNTER_CODES = {"resolution_mismatch": "resolution_too_small"}
REAL_CLIPS = (  # (path under the dataset root, frames, fps, height, width)
    ("a.mp4", 9, 16, 32, 48),
    ("videos/set_a/b.mp4", 17, 24, 48, 32),
    ("videos/set b/c.mp4", 5, 30, 32, 32),
    ("deep/er/still/d.mp4", 13, 8, 16, 64),
)


def _grid() -> list[tuple[int, float, int, int]]:
    return [(f, fps, h, w) for f in FRAMES for fps in FPS for (h, w) in SIZES] + RARE


def _write_index(root: Path, records: list[dict[str, Any]], at: Path) -> Path:
    """MindSpeed-MM's raw format: `data.json` records, `data.txt` lines of `root,json`."""
    at.mkdir(parents=True, exist_ok=True)
    (at / "data.json").write_text(json.dumps(records))
    (at / "data.txt").write_text(f"{root},{at / 'data.json'}\n")
    return at / "data.txt"


def _config(tree: Path, base: str, overrides: dict[str, Any], at: Path) -> Path:
    data = json.loads((tree / base).read_text())
    data["dataset_param"]["preprocess_parameters"].update(overrides)
    at.write_text(json.dumps(data))
    return at


def _judge(mm_tree: MMTrees, version: str, cases: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Run `upstream_dataset.py` on one MindSpeed-MM version; its result, checked to have run."""
    mm, mindspeed = mm_tree.version_dir(version), mm_tree.mindspeed_dir(version)
    if mm is None or mindspeed is None:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "mm": str(mm),
        "mindspeed": str(mindspeed),
        "megatron": str(mm_tree.megatron_dir()),
        "out": str(out / "result.json"),
        "cases": cases,
    }
    (out / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(HERE / "upstream_dataset.py"), str(out / "spec.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (out / "result.json").is_file(), f"no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads((out / "result.json").read_text())
    assert "error" not in result, result["error"]
    assert result["file"].startswith(str(mm)), result["file"]
    assert {u.split(".")[0] for u in result["used"]} <= STUBBED, result["used"]
    return result


@pytest.fixture(scope="module")
def grid_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grid")
    records = [
        {
            "path": f"clips/{i:05d}.mp4",
            "cap": "a clip",
            "num_frames": frames,
            "fps": fps,
            "resolution": {"height": h, "width": w},
        }
        for i, (frames, fps, h, w) in enumerate(_grid())
    ]
    _write_index(root / "media", records, root)
    return root


@pytest.fixture(scope="module")
def real_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real")
    rng = np.random.default_rng(0)
    records = []
    for rel, frames, fps, h, w in REAL_CLIPS:
        write_mp4(root / "dataset" / rel, rng.integers(0, 255, (frames, h, w, 3), dtype=np.uint8), fps)
        records.append(
            {
                "path": rel,
                "cap": rel,
                "num_frames": frames,
                "fps": fps,
                "resolution": {"height": h, "width": w},
            }
        )
    _write_index(root / "dataset", records, root / "index")
    return root


@pytest.fixture(scope="module")
def judged(
    mm_tree: MMTrees, grid_root: Path, real_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Every case of (a) and (b), one child per version."""
    out = tmp_path_factory.mktemp("judged")
    results = {}
    for version in VERSIONS:
        tree = mm_tree.version_dir(version)
        if tree is None or mm_tree.mindspeed_dir(version) is None:
            continue
        cases: list[dict[str, Any]] = []
        for name, (base, overrides, batches) in VARIANTS.items():
            config = _config(tree, base, overrides, out / f"{version}-{name}.json")
            for gbs in (*batches, NOTHING_LEFT_GBS) if name == "wan2.1-extract" else batches:
                cases.append(
                    {
                        "name": f"{name}@{gbs}",
                        "data_txt": str(grid_root / "data.txt"),
                        "data_config": str(config),
                        "micro_batch_size": 1,
                        "global_batch_size": gbs,
                    }
                )
        cases.append(
            {
                "name": "real",
                "data_txt": str(real_root / "index" / "data.txt"),
                "micro_batch_size": 1,
                "global_batch_size": 1,
                "read": True,
            }
        )
        results[version] = _judge(mm_tree, version, cases, out / version)
    return results


def _limits(tree: Path, name: str, gbs: int) -> ClipLimits:
    base, overrides, _ = VARIANTS[name]
    data = json.loads((tree / base).read_text())
    data["dataset_param"]["preprocess_parameters"].update(overrides)
    return limits_from_config(data, source=f"{tree.name}/{base}", global_batch_size=gbs)


def _plans(root: Path, lim: ClipLimits) -> dict[str, tuple[tuple[int, float, int, int], ClipPlan | Refusal]]:
    return {
        str(root / "media" / f"clips/{i:05d}.mp4"): (clip, plan_clip(*clip, lim))
        for i, clip in enumerate(_grid())
    }


def _differences(expected: dict[str, str], kept: dict[str, str], plans: dict[str, Any]) -> list[str]:
    paths = sorted(
        set(expected) ^ set(kept) | {p for p in set(expected) & set(kept) if expected[p] != kept[p]}
    )
    return [
        f"frames,fps,h,w={plans[p][0]}: mm-agent {expected.get(p, plans[p][1])!s}, MindSpeed-MM {kept.get(p, 'drops')}"
        for p in paths[:12]
    ] + ([f"... {len(paths) - 12} more"] if len(paths) > 12 else [])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "case", [f"{name}@{gbs}" for name, (_, _, batches) in VARIANTS.items() for gbs in batches]
)
def test_select_valid_data_keeps_what_plan_clip_accepts(
    version: str, case: str, judged: dict[str, dict[str, Any]], grid_root: Path, mm_tree: MMTrees
) -> None:
    if version not in judged:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    result = judged[version]["cases"][case]
    assert result["error"] is None, result["error"]
    name, gbs = case.split("@")
    tree = mm_tree.version_dir(version)
    assert tree is not None
    lim = _limits(tree, name, int(gbs))
    plans = _plans(grid_root, lim)
    accepted = {p: plan.sample_size for p, (_, plan) in plans.items() if isinstance(plan, ClipPlan)}
    dropped = small_groups(Counter(accepted.values()), lim)
    assert dropped and set(accepted.values()) - set(dropped), (
        "the final filter must bite and leave some groups"
    )
    expected = {p: size for p, size in accepted.items() if size not in dropped}
    kept = {v["path"]: v["sample_size"] for v in result["valid"]}
    assert kept == expected, "\n".join(_differences(expected, kept, plans))
    # What the final filter dropped, by sample_size, as small_groups names it.
    survived = Counter(kept.values())
    assert {s: n for s, n in Counter(accepted.values()).items() if s not in survived} == dropped

    # The reasons: MindSpeed-MM's counters are plan_clip's refusal codes.
    refused = Counter(plan.code for _, plan in plans.values() if isinstance(plan, Refusal))
    counters: Counter[str] = Counter()
    for key, count in result["counters"].items():
        if key not in ("total_processed", "no_aesthetic"):
            counters[COUNTER_CODES.get(key, key)] += count
    assert counters == refused
    assert result["counters"]["total_processed"] == len(plans)


@pytest.mark.parametrize("version", VERSIONS)
def test_final_filter_leaving_nothing_stops_mindspeed_mm(
    version: str, judged: dict[str, dict[str, Any]], grid_root: Path, mm_tree: MMTrees
) -> None:
    """When small_groups names every group, MindSpeed-MM's extraction fails outright (mm-agent must refuse)."""
    if version not in judged:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    tree = mm_tree.version_dir(version)
    assert tree is not None
    lim = _limits(tree, "wan2.1-extract", NOTHING_LEFT_GBS)
    sizes = Counter(
        plan.sample_size for _, plan in _plans(grid_root, lim).values() if isinstance(plan, ClipPlan)
    )
    assert sizes and small_groups(sizes, lim) == dict(sizes)
    error = judged[version]["cases"][f"wan2.1-extract@{NOTHING_LEFT_GBS}"]["error"]
    assert error is not None and "ValueError: not enough values to unpack" in error, error


@pytest.mark.parametrize("version", VERSIONS)
def test_reader_resolves_and_decodes_real_clips(
    version: str, judged: dict[str, dict[str, Any]], real_root: Path, mm_tree: MMTrees
) -> None:
    if version not in judged:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    result = judged[version]["cases"]["real"]
    assert result["error"] is None, result["error"]
    dataset = real_root / "dataset"
    assert result["paths"] == [str(dataset / rel) for rel, *_ in REAL_CLIPS]
    for read, (rel, frames, fps, _, _) in zip(result["reads"], REAL_CLIPS, strict=True):
        assert read["exists"], read
        assert "error" not in read, read
        assert read["len"] == frames, (rel, read)
        assert math.isclose(read["fps"], fps, rel_tol=1e-6), (rel, read)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], Any]:
    """A folder prepared for Wan2.1 t2v: 4 x the extraction's global batch size good clips of one size (a group
    MindSpeed-MM's final filter keeps), one good clip alone at its size (a group it drops), a too-small clip, a clip
    without caption sidecar and a corrupt file. Returns the root, the clips that must be kept and the result."""
    from mm_agent.dataset import DatasetRequest, prepare_dataset

    workspace = tmp_path_factory.mktemp("prepared")
    root = workspace / "dataset"
    rng = np.random.default_rng(1)
    write_mp4(root / "odd.mp4", rng.integers(0, 255, (9, 336, 592, 3), dtype=np.uint8), 16)
    write_mp4(root / "nocap.mp4", rng.integers(0, 255, (9, 320, 576, 3), dtype=np.uint8), 16)
    write_mp4(root / "tiny.mp4", rng.integers(0, 255, (9, 64, 64, 3), dtype=np.uint8), 16)
    (root / "broken.mp4").write_bytes(
        b"\x00\x00\x00\x18ftypmp42" + bytes(rng.integers(0, 255, 4096, dtype=np.uint8))
    )
    for rel in ("odd.mp4", "tiny.mp4", "broken.mp4"):
        (root / rel).with_suffix(".txt").write_text(f"a caption for {rel}\n")

    def request(confirm: bool) -> DatasetRequest:
        return DatasetRequest(dir=str(root), model="wan2.1", task="t2v", confirm=confirm)

    floor = 4 * int(prepare_dataset(request(False), root=workspace).limits.get("global_batch_size") or 1)
    good = [f"{'clips' if i % 2 else 'more/nested'}/{i:03d}.mp4" for i in range(floor)]
    for i, rel in enumerate(good):  # one colour each: distinct bytes, cheap to encode
        write_mp4(root / rel, np.full((9, 320, 576, 3), i * 37 % 256, dtype=np.uint8), 16)
        (root / rel).with_suffix(".txt").write_text(f"clip number {i}\n")
    return root, good, prepare_dataset(request(True), root=workspace)


def _preprocess_from(limits: dict[str, Any]) -> dict[str, Any]:
    """`preprocess_parameters` for the limits prepare_dataset reports (ClipLimits' field names)."""
    params: dict[str, Any] = {}
    for name in ClipLimits.model_fields:
        value = limits.get(name)
        if value is None or name in ("source", "text_len", "global_batch_size", "sp_size"):
            continue
        if name == "processor":
            params["video_processor_type"] = value
        elif name == "ae_stride_t":
            params["vae_scale_factor"] = [value, 8, 8]
        else:
            params[name] = value
    return params


@pytest.mark.parametrize("version", VERSIONS)
def test_prepare_dataset_index_is_what_mindspeed_mm_keeps(
    version: str, prepared: tuple[Path, list[str], Any], mm_tree: MMTrees, tmp_path: Path
) -> None:
    tree = mm_tree.version_dir(version)
    if tree is None or mm_tree.mindspeed_dir(version) is None:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    root, good, result = prepared
    assert result.written is not None and result.data_txt is not None
    assert {"tiny.mp4", "nocap.mp4", "broken.mp4"} <= {r.path for r in result.rejected}, result.rejected
    records = json.loads(Path(result.written).read_text())
    assert result.accepted == len(records)

    config = json.loads((tree / WAN_EXTRACT).read_text())
    config["dataset_param"]["preprocess_parameters"].update(_preprocess_from(result.limits))
    (tmp_path / "data_config.json").write_text(json.dumps(config))
    case = {
        "name": "prepared",
        "data_txt": result.data_txt,
        "data_config": str(tmp_path / "data_config.json"),
        "micro_batch_size": 1,
        "global_batch_size": result.limits.get("global_batch_size") or 1,
        "read": True,
    }
    judged = _judge(mm_tree, version, [case], tmp_path / "judged")["cases"]["prepared"]
    assert judged["error"] is None, judged["error"]
    # DataFileReader finds every written record at a real, decodable file with the frames and fps recorded.
    assert judged["paths"] == [str(root / r["path"]) for r in records]
    for read, record in zip(judged["reads"], records, strict=True):
        assert read["exists"] and "error" not in read, read
        assert (read["len"], read["fps"]) == (record["num_frames"], record["fps"]), (record, read)
    # MindSpeed-MM keeps exactly what prepare_dataset accepted: the good clips (odd.mp4's group is too small).
    kept = sorted(v["path"] for v in judged["valid"])
    assert kept == sorted(judged["paths"]), (
        f"accepted but dropped by MindSpeed-MM: {sorted(set(judged['paths']) - set(kept))}"
    )
    assert kept == sorted(str(root / rel) for rel in good)
