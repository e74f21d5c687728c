"""Features written by the bundled runtime, read by MindSpeed-MM's own feature dataset, sampler and loader.

One rendered bundled Wan2.1 t2v job (2 processes, micro batch 2, the renderer's `feature_data.json` with its
`LengthGroupedSampler` + `group_data` settings) extracts features with its own `feature_extraction.sh` (torchrun,
`runtime.extract`) from real mp4s: 17-frame and 9-frame clips (two `sample_size` groups), one record with no
fps/num_frames/resolution. Then, per MindSpeed-MM version, `upstream_features.py` runs under torchrun with one
process per data-parallel rank and feeds the output through `build_mm_dataset` (`FeatureDataset`),
`build_mm_dataloader` (`LengthGroupedSampler`, the real Megatron data-parallel group) and `build_iterations`, as
`pretrain_sora.py` does: every item must load with the keys, shapes and dtypes MindSpeed-MM's extraction stores,
each of the loader's `len()` micro batches must collate with only the keys `forward_step` consumes, `prompt_mask` must equal what
MindSpeed-MM's own tokenizer path gives for the caption, and the bundled trainer must read the same files. The index
as the runtime wrote it before (no `sample_num_frames`) is fed too, and must fail the way MindSpeed-MM fails on it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("decord")
pytest.importorskip("diffusers")

from mm_agent.render import RenderRequest, render_job  # noqa: E402
from runtime.features import load_feature  # noqa: E402
from runtime.synth import build_tiny_wan, make_dataset  # noqa: E402
from runtime.trainsets import FeatureSource  # noqa: E402

HERE = Path(__file__).resolve().parent
VERSIONS = ("26.0.0", "26.1.0")
SIZE, TEXT_LEN, TEXT_DIM, Z_DIM = 64, 32, 32, 16
LONG, SHORT = 17, 9  # two 4n+1 frame counts -> two sample_size groups
DP, MBS = 2, 2
# What MindSpeed-MM's video processor adds to a record (and its extraction writes to data.jsonl).
ADDED = ("start_frame_idx", "sample_frame_index", "sample_num_frames", "sample_size")
STUBBED = {
    "orjson",
    "ftfy",
    "torchvision",
    "pandas",
    "bs4",
    "pandarallel",
    "sentencepiece",
    "datasets",
    "scipy",
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dataset(root: Path) -> None:
    """6 long clips + 4 short ones under one root; the first record keeps only path and cap."""
    make_dataset(root, 6, frames=LONG, height=SIZE, width=SIZE)
    make_dataset(root / "short", 4, frames=SHORT, height=SIZE, width=SIZE, seed=1)
    records = json.loads((root / "data.json").read_text())
    records += [
        {**r, "path": f"short/{r['path']}"} for r in json.loads((root / "short/data.json").read_text())
    ]
    records[0] = {"path": records[0]["path"], "cap": records[0]["cap"]}
    (root / "data.json").write_text(json.dumps(records, indent=2))


@pytest.fixture(scope="module")
def extracted(upstream: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("features")
    weights = build_tiny_wan(tmp / "weights")
    _dataset(tmp / "dataset")
    job = tmp / "job"
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            backend="megatron",
            size="1.3b",
            runtime="bundled",
            out_dir=str(job),
            weights_dir=str(weights),
            load_path=str(tmp / "converted"),
            dataset_dir=str(tmp / "dataset"),
            dataset_file=str(tmp / "dataset" / "data.json"),
            feature_dir=str(tmp / "sora_features"),
            save_path=str(tmp / "checkpoints"),
            npus_per_node=DP,
            nnodes=1,
            tp=1,
            pp=1,
            cp=1,
            mbs=MBS,
            grad_acc=1,
            train_iters=4,
            save_interval=4,
            num_workers=0,
            num_frames=LONG,
            max_height=SIZE,
            max_width=SIZE,
            text_len=TEXT_LEN,
            confirm=True,
        )
    )
    env = {**os.environ, "MM_AGENT_DEVICE": "cpu", "MASTER_PORT": str(_port())}
    done = subprocess.run(
        ["bash", str(job / "feature_extract" / "feature_extraction.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"job": job, "features": tmp / "sora_features", "dataset": tmp / "dataset"}


def _records(features: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (features / "data.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def judged(
    extracted: dict[str, Path], mm_tree: Any, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """One torchrun launch, one process per data-parallel rank, judging every version present in turn."""
    out = tmp_path_factory.mktemp("upstream")
    stripped = out / "data.jsonl"  # the index as the runtime wrote it before: the dataset record + "file"
    rows = []
    for record in _records(extracted["features"]):
        row = {k: v for k, v in record.items() if k not in ADDED}
        row["resolution"] = {k: v for k, v in record["resolution"].items() if not k.startswith("sample_")}
        rows.append(json.dumps(row))
    stripped.write_text("\n".join(rows) + "\n")
    versions = []
    for name in VERSIONS:
        mm, mindspeed = mm_tree.version_dir(name), mm_tree.mindspeed_dir(name)
        if mm is not None and mindspeed is not None:
            versions.append({"name": name, "mm": str(mm), "mindspeed": str(mindspeed)})
    job = extracted["job"]
    spec = {
        "versions": versions,
        "megatron": str(mm_tree.megatron_dir()),
        "data_config": str(job / "feature_data.json"),
        "extract_config": str(job / "feature_extract" / "data.json"),
        "model_config": str(job / "feature_extract" / "model_t2v.json"),
        "micro_batch_size": MBS,
        "global_batch_size": MBS * DP,
        "num_workers": 0,
        "seed": 1234,
        "out": str(out),
        "stripped": str(stripped),
    }
    (out / "spec.json").write_text(json.dumps(spec))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(DP)]
    launcher += ["--master_port", str(_port()), str(HERE / "upstream_features.py"), str(out / "spec.json")]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(launcher, cwd=out, env=env, capture_output=True, text=True, timeout=300)
    results = []
    for rank in range(DP):
        path = out / f"rank{rank}.json"
        assert path.is_file(), f"rank {rank} wrote no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        result = json.loads(path.read_text())
        assert "error" not in result, result.get("error")
        # Only modules MindSpeed-MM imports off the feature path, missing here, are stubbed (orjson is shimmed).
        assert {u.split(".")[0] for u in result["used"]} <= STUBBED, result["used"]
        results.append(result)
    return results


@pytest.mark.parametrize("version", VERSIONS)
def test_mindspeed_mm_reads_bundled_features(
    version: str, extracted: dict[str, Path], judged: list[dict[str, Any]], mm_tree: Any
) -> None:
    if mm_tree.version_dir(version) is None or mm_tree.mindspeed_dir(version) is None:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    records = _records(extracted["features"])
    assert len(records) == 10, "every clip is extracted"
    for ranked in judged:
        result = ranked["versions"][version]
        assert result["file"].startswith(str(mm_tree.version_dir(version)))
        assert result["dp"] == DP
        assert result["classes"] == ["DataLoader", "FeatureDataset", "LengthGroupedSampler"]
        # MindSpeed-MM's data_samples are data.jsonl's records, as the runtime wrote them.
        assert result["records"] == records

        # Every item loads, with what MindSpeed-MM's extraction stores (get_sora_feature._save_sample_features).
        assert len(result["items"]) == len(records)
        for record, item in zip(records, result["items"], strict=True):
            frames = record["sample_num_frames"]
            assert set(item) == {"video", "prompt_ids", "prompt_mask"}
            assert item["video"] == {
                "shape": [Z_DIM, (frames - 1) // 4 + 1, SIZE // 8, SIZE // 8],
                "dtype": "bfloat16",
            }
            assert item["prompt_ids"]["shape"] == [1, TEXT_LEN, TEXT_DIM]
            assert item["prompt_mask"] == {"shape": [1, TEXT_LEN], "dtype": "int64"}

        # The loader's micro batches on this rank: each collates (one sample_size per batch) and carries only the
        # keys forward_step pops, so nothing reaches the model as an unexpected keyword.
        assert len(result["batches"]) == len(records) // MBS  # len() of MindSpeed-MM's loader
        for batch in result["batches"]:
            assert set(batch) == {"video", "prompt_ids", "prompt_mask"}
            assert batch["video"]["shape"][:2] == [MBS, Z_DIM] and batch["video"]["shape"][2] in (3, 5)
            assert batch["prompt_ids"]["shape"] == [MBS, 1, TEXT_LEN, TEXT_DIM]
            assert batch["prompt_mask"] == {"shape": [MBS, 1, TEXT_LEN], "dtype": "int64"}

        # prompt_mask is MindSpeed-MM's own tokenisation of the caption (Tokenizer + TextProcesser).
        for record, mask in zip(records, result["masks"], strict=True):
            stored = load_feature(extracted["features"] / record["file"])["prompt_mask"]
            assert mask["shape"] == list(stored.shape) and mask["values"] == stored.tolist(), record["path"]

        # The frame plan is the one MindSpeed-MM's own extraction indexes for the same clips (its T2VDataset on the
        # rendered extraction config). It drops a record without fps/resolution ("no_resolution"); the runtime
        # reads them from the clip.
        stock = {r["path"]: r for r in result["stock"]}
        assert set(stock) == {r["path"] for r in records[1:]}
        for record in records[1:]:
            mine = {k: record[k] for k in (*ADDED, "num_frames", "resolution")}
            assert mine == {k: stock[record["path"]][k] for k in mine}, record["path"]

        # Before the fix: the index without the video processor's fields stops MindSpeed-MM's sampler.
        assert result["before"] == "KeyError: 'sample_num_frames'"


def test_index_records_follow_the_clips(extracted: dict[str, Path]) -> None:
    """data.jsonl: MindSpeed-MM's record fields, typed as its video processor writes them, true to each clip."""
    records = _records(extracted["features"])
    source = {
        str(extracted["dataset"] / r["path"]): r
        for r in json.loads((extracted["dataset"] / "data.json").read_text())
    }
    sizes = {}
    for record in records:
        frames = SHORT if "/short/" in record["path"] else LONG
        assert record["sample_frame_index"] == list(range(frames))
        assert record["sample_num_frames"] == frames and record["start_frame_idx"] == 0
        assert record["sample_size"] == f"{frames}x{SIZE}x{SIZE}"
        res = record["resolution"]
        assert res == {"height": SIZE, "width": SIZE, "sample_height": SIZE, "sample_width": SIZE}
        assert isinstance(record["num_frames"], int) and record["num_frames"] == frames
        assert record["fps"] == 16
        raw = source[record["path"]]  # the dataset's own values are kept
        assert all(record[k] == v for k, v in raw.items() if k not in ("path", "resolution"))
        assert {k: res[k] for k in raw.get("resolution", {})} == raw.get("resolution", {})
        assert record["file"].startswith("features/") and record["file"].endswith(".pt")
        sizes[record["sample_size"]] = sizes.get(record["sample_size"], 0) + 1
    assert sizes == {f"{LONG}x{SIZE}x{SIZE}": 6, f"{SHORT}x{SIZE}x{SIZE}": 4}
    # The bundled trainer reads the same files ([1, L, D] text features read as [L, D]).
    source_set = FeatureSource(str(extracted["features"] / "data.jsonl"), str(extracted["features"]))
    for i in range(len(source_set)):
        assert tuple(source_set[i]["prompt_ids"].shape) == (TEXT_LEN, TEXT_DIM)
