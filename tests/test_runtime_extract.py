"""runtime.extract / encoders / features: real mp4s, real tiny Wan weights, real torchrun processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from runtime.encoders import TextEncoder, VideoEncoder
from runtime.errors import RuntimeFailure
from runtime.extract import ExtractConfig, decode_ahead, parse_args
from runtime.features import FeatureDataset, load_feature
from runtime.mmdata import Sample, read_samples
from runtime.synth import build_tiny_wan, make_dataset, write_extract_configs, write_mp4
from runtime.video import read_clip, to_model_input

REPO = Path(__file__).resolve().parents[1]
FRAMES, SIZE, TEXT_LEN = 17, 64, 32
LATENT = [16, 5, 8, 8]  # z_dim, (17-1)/4+1, 64/8, 64/8


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan(tmp_path_factory.mktemp("weights"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dataset")
    make_dataset(root, 8, frames=FRAMES, height=SIZE, width=SIZE)
    return root


def configs(tmp: Path, dataset: Path, weights: Path, **preprocess: Any) -> dict[str, Path]:
    return write_extract_configs(
        tmp / "cfg",
        dataset_dir=dataset,
        weights=weights,
        save_path=tmp / "features",
        num_frames=FRAMES,
        height=SIZE,
        width=SIZE,
        text_len=TEXT_LEN,
        preprocess=preprocess or None,
    )


def extract_cmd(cfg: dict[str, Path], *extra: str, nproc: int = 1, port: int = 0) -> list[str]:
    entry = ["-m", "runtime.extract", "--mm-data", str(cfg["data"]), "--mm-model", str(cfg["model"])]
    entry += ["--mm-tool", str(cfg["tool"]), *extra]
    if nproc == 1:
        return [sys.executable, *entry]
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port)]
    return [sys.executable, *launcher, *entry]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MM_AGENT_DEVICE": "cpu"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def index(save: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (save / "data.jsonl").read_text().splitlines()]


def report(save: Path) -> dict[str, Any]:
    return json.loads((save / "extract_report.json").read_text())


# --- encoders -------------------------------------------------------------------------------------------


def test_video_encoder_normalises_with_the_vae_latent_stats(
    weights: Path, tmp_path: Path, dataset: Path
) -> None:
    vae_dir = tmp_path / "vae"
    shutil.copytree(weights / "vae", vae_dir)
    config = json.loads((vae_dir / "config.json").read_text())
    mean = [0.1 * i - 0.5 for i in range(16)]
    std = [0.5 + 0.1 * i for i in range(16)]
    (vae_dir / "config.json").write_text(json.dumps({**config, "latents_mean": mean, "latents_std": std}))
    block = {"model_id": "wan_video_vae", "norm_latents": True, "norm_mode": "channel_specified_shift_scale"}
    cpu = torch.device("cpu")
    plain = VideoEncoder.from_config(
        {**block, "from_pretrained": str(weights / "vae"), "norm_latents": False}, cpu, torch.float32
    )
    shifted = VideoEncoder.from_config({**block, "from_pretrained": str(vae_dir)}, cpu, torch.float32)
    video = to_model_input(read_clip(str(dataset / "videos/set_a/clip0000.mp4"), FRAMES, SIZE, SIZE)[None])
    raw = plain.encode(video)
    normalised = shifted.encode(video)
    assert list(raw.shape) == [1, *LATENT]
    expected = (raw - torch.tensor(mean).view(1, -1, 1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(normalised, expected, rtol=1e-4, atol=1e-5)
    decoded = shifted.decode(normalised)
    assert decoded.shape == (1, 3, FRAMES, SIZE, SIZE) and float(decoded.abs().max()) <= 1.0


def test_text_encoder_pads_to_max_length_and_zeroes_padding(weights: Path) -> None:
    cpu = torch.device("cpu")
    tok = {"from_pretrained": str(weights / "tokenizer"), "model_max_length": TEXT_LEN}
    te = {"model_id": "UMT5", "from_pretrained": str(weights / "text_encoder")}
    encoder = TextEncoder.from_config(te, [tok], cpu, torch.float32)
    hidden, mask = encoder.encode(
        ["a red square moving left", "a blue circle moving up slowly on a grey background"]
    )
    assert hidden.shape == (2, TEXT_LEN, 32) and mask.shape == (2, TEXT_LEN) and mask.dtype == torch.int64
    lengths = mask.sum(dim=1).tolist()
    assert 2 < lengths[0] < lengths[1] < TEXT_LEN
    assert float(hidden[0, lengths[0] :].abs().max()) == 0.0
    assert float(hidden[0, : lengths[0]].abs().min(dim=-1).values.max()) > 0.0


def test_encoders_refuse_missing_weights_with_the_field(tmp_path: Path) -> None:
    block = {"model_id": "wan_video_vae", "from_pretrained": str(tmp_path / "nope")}
    with pytest.raises(RuntimeFailure, match="not a local directory") as info:
        VideoEncoder.from_config(block, torch.device("cpu"), torch.float32, source="model_t2v.json")
    assert info.value.field == "ae.from_pretrained" and info.value.file == "model_t2v.json"


# --- configs and arguments ----------------------------------------------------------------------------


def test_config_checks_mirror_mindspeed_mm(tmp_path: Path, dataset: Path, weights: Path) -> None:
    cfg = configs(tmp_path, dataset, weights)
    loaded = ExtractConfig.load(str(cfg["data"]), str(cfg["model"]), str(cfg["tool"]))
    assert len(loaded.samples) == 8 and loaded.samples[0].path == str(dataset / "videos/set_a/clip0000.mp4")
    data = json.loads(cfg["data"].read_text())
    del data["dataset_param"]["preprocess_parameters"]["train_pipeline"]["video_only"]
    cfg["data"].write_text(json.dumps(data))
    with pytest.raises(
        RuntimeFailure, match='"video_only" key not found in vid_img_process\\["train_pipeline"\\]'
    ):
        ExtractConfig.load(str(cfg["data"]), str(cfg["model"]), str(cfg["tool"]))
    with pytest.raises(RuntimeFailure, match="unknown argument '--bogus'"):
        parse_args(["--mm-data", "a", "--mm-model", "b", "--mm-tool", "c", "--bogus", "1"])


def test_feature_dataset_accepts_only_pt_files(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text(json.dumps({"path": "a.mp4", "file": "features/a.npy"}) + "\n")
    with pytest.raises(RuntimeFailure, match=r"Only \.pt files are currently supported"):
        FeatureDataset(str(tmp_path / "data.jsonl"), str(tmp_path))
    with pytest.raises(RuntimeFailure, match="feature index not found") as info:
        FeatureDataset(str(tmp_path / "missing.jsonl"), str(tmp_path))
    assert "run feature extraction first" in (info.value.fix or "")


def test_decode_ahead_keeps_order_and_passes_failures_through(dataset: Path) -> None:
    samples = read_samples(dataset / "data.json", "standard")
    bad = samples[2]

    def read(sample: Sample) -> torch.Tensor:
        if sample is bad:
            raise RuntimeFailure("cannot decode video: test", file=sample.path)
        return read_clip(str(dataset / sample.path), FRAMES, 32, 32)

    jobs = [(s, f"n{s.index}") for s in samples]
    inline = list(decode_ahead(jobs, read, workers=0, window=0))
    threaded = list(decode_ahead(jobs, read, workers=2, window=3))
    assert (
        [(s.index, n) for s, n, _ in threaded]
        == [(s.index, n) for s, n, _ in inline]
        == [(s.index, f"n{s.index}") for s in samples]
    )
    for (_, _, a), (_, _, b) in zip(inline, threaded, strict=True):
        if isinstance(a, RuntimeFailure):
            assert isinstance(b, RuntimeFailure) and b.message == a.message
        else:
            assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    assert sum(isinstance(r, RuntimeFailure) for _, _, r in threaded) == 1


# --- extraction runs ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_torchrun_two_ranks_extract_every_sample_once(tmp_path: Path, dataset: Path, weights: Path) -> None:
    cfg = configs(tmp_path, dataset, weights)
    model = json.loads(cfg["model"].read_text())
    model["ae"]["dtype"] = "bf16"  # MindSpeed-MM's default: latents are stored in bf16
    cfg["model"].write_text(json.dumps(model))
    done = run(extract_cmd(cfg, "--micro-batch-size", "2", nproc=2, port=free_port()))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Starting feature extraction. Total samples: 8" in done.stdout
    assert "feature extraction progress: 8/8 samples" in done.stdout
    assert "Feature extraction completed successfully" in done.stdout
    save = tmp_path / "features"
    records = index(save)
    assert len(records) == 8
    assert sorted(r["path"] for r in records) == sorted(str(p) for p in dataset.glob("videos/*/*.mp4"))
    files = [r["file"] for r in records]
    assert len(set(files)) == 8 and sorted(files) == sorted(
        f"features/{p.name}" for p in (save / "features").iterdir()
    )
    # Same basename in two folders: two different feature files.
    clip0 = [r["file"] for r in records if r["path"].endswith("clip0000.mp4")]
    assert len(clip0) == 2 and clip0[0] != clip0[1]
    rep = report(save)
    assert (rep["total"], rep["extracted"], rep["skipped_existing"], rep["failed"]) == (8, 8, 0, [])
    # MindSpeed-MM's FeatureDataset contract: data_path = data.jsonl, data_folder = save_path.
    features = FeatureDataset(str(save / "data.jsonl"), str(save))
    assert len(features) == 8
    for i in range(len(features)):
        item = features[i]
        assert list(item["video"].shape) == LATENT and item["video"].dtype == torch.bfloat16
        assert item["prompt_ids"].dtype == torch.float32 and item["prompt_mask"].dtype == torch.int64
        # MindSpeed-MM's layout: one caption per sample, so [1, L, D] / [1, L].
        assert item["prompt_ids"].shape == (1, TEXT_LEN, 32) and item["prompt_mask"].shape == (1, TEXT_LEN)
    # Each record carries the frame plan MindSpeed-MM's grouped sampler reads (sample_num_frames, sample_size).
    for record in records:
        assert record["sample_frame_index"] == list(range(FRAMES)) and record["sample_num_frames"] == FRAMES
        assert record["sample_size"] == f"{FRAMES}x{SIZE}x{SIZE}" and record["start_frame_idx"] == 0
        assert record["resolution"] == {
            "height": SIZE,
            "width": SIZE,
            "sample_height": SIZE,
            "sample_width": SIZE,
        }
    # The stored latents are what the encoder gives for that clip (the right clip went to the right file).
    first = records[0]
    vae = VideoEncoder.from_config(model["ae"], torch.device("cpu"), torch.float32)
    direct = vae.encode(to_model_input(read_clip(first["path"], FRAMES, SIZE, SIZE)[None]))[0]
    torch.testing.assert_close(load_feature(save / first["file"])["video"], direct.to(torch.bfloat16))
    # A missing feature file is named by the training dataset, with the fix.
    (save / records[3]["file"]).unlink()
    with pytest.raises(RuntimeFailure, match="feature file not found") as info:
        features[3]
    assert info.value.file == str(save / records[3]["file"]) and "--skip-existing" in (info.value.fix or "")


@pytest.mark.slow
def test_two_ranks_odd_sample_count_write_each_feature_once(tmp_path: Path, weights: Path) -> None:
    """MindSpeed-MM's samplers fill the last step of an uneven split with repeated samples, so two ranks write one
    feature file at once (validate's extract.duplicate_writes). The bundled extraction gives sample i to rank
    i % world: 5 samples on 2 ranks with micro batch 2 are 3 + 2, each file is written once (temp name, then
    os.replace), and data.jsonl holds each sample once."""
    root = tmp_path / "data"
    make_dataset(root, 5, frames=FRAMES, height=SIZE, width=SIZE, seed=7)
    cfg = configs(tmp_path, root, weights)
    done = run(extract_cmd(cfg, "--micro-batch-size", "2", nproc=2, port=free_port()))
    assert done.returncode == 0, done.stdout + done.stderr
    save = tmp_path / "features"
    rep = report(save)
    assert rep["per_rank"] == [3, 2], rep  # every sample handled by exactly one rank
    assert (rep["total"], rep["extracted"], rep["failed"]) == (5, 5, [])
    records = index(save)
    assert len(records) == 5
    assert len({r["file"] for r in records}) == 5 and len({r["path"] for r in records}) == 5
    # Nothing but the five finished files (no temp file left, none torn: each loads whole with its shapes).
    names = sorted(Path(r["file"]).name for r in records)
    assert sorted(p.name for p in (save / "features").iterdir()) == names
    for record in records:
        feature = load_feature(save / record["file"])
        assert list(feature["video"].shape) == LATENT and feature["prompt_mask"].shape == (1, TEXT_LEN)


@pytest.mark.slow
def test_bad_and_short_videos_are_skipped_and_listed(tmp_path: Path, dataset: Path, weights: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(dataset, root)
    (root / "videos/broken.mp4").write_bytes(
        np.random.default_rng(0).integers(0, 255, 4096, dtype=np.uint8).tobytes()
    )
    write_mp4(root / "videos/short.mp4", np.zeros((5, SIZE, SIZE, 3), dtype=np.uint8), 16)
    records = json.loads((root / "data.json").read_text())
    extra = [
        {"path": f"videos/{n}.mp4", "cap": ["a bad clip", "  a  bad   clip "]} for n in ("broken", "short")
    ]
    (root / "data.json").write_text(json.dumps(records[:3] + extra))
    cfg = configs(tmp_path, root, weights, min_num_frames=9)
    done = run(extract_cmd(cfg))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: 2 of 5 samples failed" in done.stdout
    save = tmp_path / "features"
    rep = report(save)
    assert (rep["total"], rep["extracted"]) == (5, 3)
    reasons = {Path(f["path"]).name: f["reason"] for f in rep["failed"]}
    assert set(reasons) == {"broken.mp4", "short.mp4"}
    assert "cannot decode" in reasons["broken.mp4"] and "too short" in reasons["short.mp4"]
    assert len(index(save)) == 3 and len(list((save / "features").glob("*.pt"))) == 3


@pytest.mark.slow
def test_all_failed_exits_nonzero_with_a_clear_error(tmp_path: Path, weights: Path) -> None:
    root = tmp_path / "data"
    (root / "videos").mkdir(parents=True)
    (root / "videos/broken.mp4").write_bytes(b"not a video")
    (root / "data.json").write_text(json.dumps([{"path": "videos/broken.mp4", "cap": "x"}]))
    done = run(extract_cmd(configs(tmp_path, root, weights)))
    assert done.returncode == 2
    assert "error: no clip could be extracted: all 1 failed" in done.stderr
    assert "Feature extraction failed:" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.slow
def test_kill_9_then_skip_existing_gives_every_sample_once(
    tmp_path_factory: pytest.TempPathFactory, weights: Path
) -> None:
    tmp = tmp_path_factory.mktemp("kill")
    root = tmp / "data"
    make_dataset(root, 24, frames=FRAMES, height=SIZE, width=SIZE, seed=3)
    cfg = configs(tmp, root, weights)
    feats = tmp / "features" / "features"
    env = {**os.environ, "MM_AGENT_DEVICE": "cpu"}
    proc = subprocess.Popen(
        extract_cmd(cfg, nproc=2, port=free_port()),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(feats.glob("*.pt"))) < 3 and proc.poll() is None:
        time.sleep(0.02)
    # kill -9 the whole job: torchrun's group and its workers (torchrun starts each worker in its own session).
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
    proc.wait()
    psutil.wait_procs(workers, timeout=10)
    before = list(feats.glob("*.pt"))
    assert 3 <= len(before) < 24, "the kill must land mid-extraction"
    for path in before:  # atomic writes: whatever exists under a .pt name is complete
        assert set(load_feature(path)) == {"video", "prompt_ids", "prompt_mask"}
    assert not (tmp / "features" / "data.jsonl").exists()
    # A damaged file (e.g. a disk problem after the fact) is redone, not kept.
    damaged = before[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    done = run(extract_cmd(cfg, "--skip-existing", nproc=2, port=free_port()))
    assert done.returncode == 0, done.stdout + done.stderr
    rep = report(tmp / "features")
    assert rep["skipped_existing"] == len(before) - 1
    assert rep["extracted"] == 24 - len(before) + 1 and rep["failed"] == []
    records = index(tmp / "features")
    assert len(records) == 24 and len({r["file"] for r in records}) == 24
    assert len({r["path"] for r in records}) == 24
    for record in records:  # kept files are indexed like fresh ones (their frame plan comes from the clip)
        assert list(load_feature(tmp / "features" / record["file"])["video"].shape) == LATENT
        assert record["sample_num_frames"] == FRAMES and record["sample_size"] == f"{FRAMES}x{SIZE}x{SIZE}"
    assert sorted(p.name for p in feats.iterdir()) == sorted(Path(r["file"]).name for r in records)
