"""Clips per second of `runtime.extract` against a naive sequential decode-then-encode loop, same run.

Synthesises tiny Wan2.1 weights and --clips mp4 clips (--frames x --source x --source, moving shapes), then
extracts features for all of them, to --target x --target, several ways:
  * naive: one process, for each clip: decode every frame with decord, keep the first --frames, resize with
    torch (antialiased bilinear), encode with the VAE and the text encoder one clip at a time, torch.save;
  * runtime.extract, 1 process, micro-batch 1 (the rendered scripts' default): the same work per clip, plus
    the per-sample checks, atomic writes and progress (decode threads run ahead only on an NPU/GPU);
  * runtime.extract, 1 process, micro-batch 4: clips of the same shape share a VAE call, captions one
    text-encoder call;
  * runtime.extract under torchrun with 2 processes, micro-batch 4 (OMP_NUM_THREADS=1 each, torchrun's default).
Clips/s counts decode + encode + save after the models are loaded (runtime: `clips_per_second` from
extract_report.json); "end to end" is the whole command, process start-up and model loading included.
Cases take turns, --runs rounds; the median and the range are printed, since on a shared box a busy
neighbour slows 2-thread OpenMP runs several-fold for seconds at a time. `--threads 1` sets OMP_NUM_THREADS=1
for every case (torchrun does that for its workers anyway), which makes the figures far steadier there.
fp32 throughout (the runtime computes in fp32 on the CPU whatever the config says).

    python benchmarks/extract_throughput.py [--clips 24] [--frames 17] [--source 128] [--target 64]
        [--runs 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def naive(data_json: Path, weights: Path, out: Path, frames: int, target: int) -> tuple[float, float]:
    """The baseline loop; returns (clips/s after loading, end-to-end seconds including model loading)."""
    start = time.perf_counter()
    import decord
    import torch
    import torch.nn.functional as F
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel

    vae = AutoencoderKLWan.from_pretrained(weights / "vae", local_files_only=True).eval()
    text_encoder = UMT5EncoderModel.from_pretrained(weights / "text_encoder", local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(weights / "tokenizer", local_files_only=True)
    records = json.loads(data_json.read_text())
    out.mkdir(parents=True, exist_ok=True)
    loaded = time.perf_counter()
    with torch.no_grad():
        for i, record in enumerate(records):
            reader = decord.VideoReader(str(data_json.parent / record["path"]), ctx=decord.cpu(0))
            video = torch.from_numpy(reader.get_batch(list(range(len(reader)))).asnumpy())[:frames]
            video = video.permute(0, 3, 1, 2).float()
            video = F.interpolate(video, size=(target, target), mode="bilinear", antialias=True)
            video = (video / 127.5 - 1.0).permute(1, 0, 2, 3)[None]
            latents = vae.encode(video).latent_dist.mode()
            tokens = tokenizer(
                [record["cap"]], padding="max_length", max_length=32, truncation=True, return_tensors="pt"
            )
            hidden = text_encoder(tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
            feature = {"video": latents[0], "prompt_ids": hidden[0], "prompt_mask": tokens.attention_mask[0]}
            torch.save(feature, out / f"{i}.pt")
    end = time.perf_counter()
    return len(records) / (end - loaded), end - start


def child_env(threads: int | None) -> dict[str, str]:
    env = {**os.environ, "MM_AGENT_DEVICE": "cpu"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def naive_case(
    data_json: Path, weights: Path, out: Path, frames: int, target: int, threads: int | None
) -> tuple[float, float]:
    """The naive loop in its own process (like the runtime cases, so start-up counts alike)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        __file__,
        "--naive",
        str(data_json),
        str(weights),
        str(out),
        str(frames),
        str(target),
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(threads), capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    return float(json.loads(done.stdout.strip().splitlines()[-1])["clips_per_second"]), wall


def runtime_case(cfg: dict[str, Path], nproc: int, mbs: int, threads: int | None) -> tuple[float, float]:
    """One `runtime.extract` run in a subprocess; returns (clips/s from the report, end-to-end seconds)."""
    save = json.loads(cfg["tool"].read_text())["sorafeature"]["save_path"]
    shutil.rmtree(save, ignore_errors=True)
    entry = ["-m", "runtime.extract", "--mm-data", str(cfg["data"]), "--mm-model", str(cfg["model"])]
    entry += [
        "--mm-tool",
        str(cfg["tool"]),
        "--micro-batch-size",
        str(mbs),
        "--global-batch-size",
        str(mbs * nproc),
    ]
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", "29617"]
    cmd = [sys.executable, *(launcher if nproc > 1 else []), *entry]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(threads), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"runtime.extract failed:\n{done.stdout}\n{done.stderr}")
    report = json.loads((Path(save) / "extract_report.json").read_text())
    assert report["extracted"] == report["total"], report
    return float(report["clips_per_second"]), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--source", type=int, default=128, help="clip height and width")
    parser.add_argument("--target", type=int, default=64, help="max_height and max_width")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every case")
    parser.add_argument(
        "--naive",
        nargs=5,
        metavar=("DATA_JSON", "WEIGHTS", "OUT", "FRAMES", "TARGET"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.naive:
        data, weights_dir, out, frames, target = args.naive
        rate, _ = naive(Path(data), Path(weights_dir), Path(out), int(frames), int(target))
        print(json.dumps({"clips_per_second": rate}))
        return 0
    sys.path.insert(0, str(ROOT))
    from runtime.synth import build_tiny_wan, make_dataset, write_extract_configs

    with tempfile.TemporaryDirectory(prefix="extract-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        weights = build_tiny_wan(tmp / "weights")
        data_json = make_dataset(
            tmp / "data", args.clips, frames=args.frames, height=args.source, width=args.source
        )
        cfg = write_extract_configs(
            tmp / "cfg",
            dataset_dir=tmp / "data",
            weights=weights,
            save_path=tmp / "features",
            num_frames=args.frames,
            height=args.target,
            width=args.target,
        )
        t = args.threads
        cases = {
            "naive sequential loop": lambda: naive_case(
                data_json, weights, tmp / "naive", args.frames, args.target, t
            ),
            "runtime.extract 1 proc, MBS 1": lambda: runtime_case(cfg, 1, 1, t),
            "runtime.extract 1 proc, MBS 4": lambda: runtime_case(cfg, 1, 4, t),
            "runtime.extract torchrun 2 procs, MBS 4": lambda: runtime_case(cfg, 2, 4, t),
        }
        rates: dict[str, list[float]] = {name: [] for name in cases}
        walls: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):  # cases take turns so background load hits them alike
            for name, case in cases.items():
                rate, wall = case()
                rates[name].append(rate)
                walls[name].append(wall)
    base_rate = statistics.median(rates["naive sequential loop"])
    base_wall = statistics.median(walls["naive sequential loop"])
    print(
        f"{args.clips} clips {args.frames}x{args.source}x{args.source} -> {args.target}x{args.target}, "
        f"tiny Wan2.1 VAE + UMT5, CPU ({os.cpu_count()} cores, OMP_NUM_THREADS={t or 'default'}), "
        f"median of {args.runs} (range)"
    )
    print(f"{'case':<42}{'clips/s':>9}{'range':>15}{'ratio':>7}{'end to end s':>14}{'ratio':>7}")
    for name in cases:
        rate, wall = statistics.median(rates[name]), statistics.median(walls[name])
        spread = f"{min(rates[name]):.2f}-{max(rates[name]):.2f}"
        print(
            f"{name:<42}{rate:>9.2f}{spread:>15}{rate / base_rate:>7.2f}{wall:>14.1f}{base_wall / wall:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
