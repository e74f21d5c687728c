"""The estimator against measurement: the bundled runtime trains a small Wan DiT on this machine over a grid of
shapes (video frames x resolution x recompute on/off), each in a process of its own, and `mm_agent.estimate`
is asked about the same model and shape (the bundled runtime's memory profile, the device's workspace);
both are printed side by side with the error.

  * memory, on CPU: the training process's peak RSS, with glibc told to return every freed block of 128 KiB
    or more at once (MALLOC_MMAP_THRESHOLD_=131072), so the peak is the tensors alive at once - the CPU
    analogue of CUDA's max_memory_allocated, which the estimate models. The same runs under glibc's default
    policy are printed beside it ("glibc RSS"): freed blocks kept for reuse add to RSS without being tensors.
    On CUDA/NPU (`--device`, `--bf16` for autocast): the device's max_memory_allocated, which holds no
    runtime context, so there the "w/o ws" column is the one to read.
  * workspace: the process once the trainer is built, less the model's weights (interpreter, torch, runtime
    modules, the data loader), printed so the `cpu` entry of registry/data/devices.yaml can be checked;
  * step time: the median step against the estimator's FLOPs per step over this CPU's measured fp32 matmul
    rate (so the printed MFU is what the runtime reached of it).
Goal (issue 18): memory within +-20 %.

    python benchmarks/estimate_calibration.py [--hidden 384] [--layers 4] [--steps 5] [--threads 2]
                                              [--device cpu|cuda|npu] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from lora import child as train_child  # noqa: E402
from lora import write_job  # noqa: E402  (benchmarks/lora.py: features, configs, base checkpoint)

GRID = [
    (frames, size, recompute) for frames in (17, 33) for size in (128, 256) for recompute in ("none", "full")
]
MIB = 1 << 20
VAE_T = 4  # Wan's VAE packs 4 frames per latent frame after the first
LIVE = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # glibc: blocks >= 128 KiB mapped alone and unmapped when freed


def latent_frames(frames: int) -> int:
    """The feature files hold latents: 17 video frames are 5 latent frames (what `estimate` counts from)."""
    return (frames - 1) // VAE_T + 1


def child(root: Path, recompute: str, opts: argparse.Namespace) -> dict[str, Any]:
    """Train in this process for warmup + steps iterations (benchmarks/lora.py's full fine-tune, with
    recompute when asked): the process's peak, its size once the trainer was built, the median step."""
    extra = (("--recompute-granularity", "full") if recompute == "full" else ()) + (
        ("--bf16",) if opts.bf16 else ()
    )
    got = train_child(root, "full", opts, extra)
    accel = opts.device != "cpu"
    return {
        "step_s": got["step_ms"] / 1000,
        "peak_bytes": got["peak_bytes"] if accel else got["peak_rss"],
        "workspace_bytes": 0 if accel else got["rss_built"] - got["weight_bytes"],
    }


def matmul_rate(threads: int) -> float:
    """fp32 FLOP/s of a 1024^3 matmul on this CPU with `threads` threads (the best of a few)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(8):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * 1024**3 / best


def estimate(frames: int, size: int, recompute: str, opts: argparse.Namespace) -> tuple[float, float, float]:
    """(bytes, workspace bytes, FLOPs per step) the estimator gives for the benchmark's DiT and shape in the
    bundled runtime."""
    from mm_agent.estimate.devices import load_devices
    from mm_agent.estimate.flops import flops_per_sample
    from mm_agent.estimate.memory import GB, Layout, breakdown
    from mm_agent.estimate.model import ModelShape, wan_tower
    from mm_agent.estimate.profiles import load_profiles
    from mm_agent.estimate.tokens import count_tokens

    arch = {"hidden_size": opts.hidden, "ffn_dim": 4 * opts.hidden, "num_layers": opts.layers,
            "text_dim": 256, "freq_dim": 256, "in_dim": 16, "out_dim": 16, "patch_size": [1, 2, 2]}  # fmt: skip
    shape = ModelShape(
        kind="video", main=wan_tower(arch), vit=None, cross_attention=True, vocab=0, encoders=0.0,
        vae_stride=(VAE_T, 8, 8), patch=(1, 2, 2), default_text_len=64, frame_chunk=None, stock_shape=None,
        source="benchmark arch",
    )  # fmt: skip
    precision = "bf16" if opts.bf16 and opts.device != "cpu" else "fp32"  # the CPU never autocasts
    tokens = count_tokens(shape, frames, size, size, 64)
    lay = Layout(npus=1, tp=1, pp=1, cp=1, mbs=1, recompute=recompute, sharding="none", lora=False,  # type: ignore[arg-type]
                 online_encoders=False, profile=load_profiles().find("bundled", precision))  # fmt: skip
    workspace = load_devices().find("cpu").workspace_gb if opts.device == "cpu" else 0.0
    parts = breakdown(shape, tokens, lay, workspace_gb=workspace)
    return sum(parts.values()) * GB, parts["workspace"] * GB, flops_per_sample(shape, tokens, lay)


def measure(
    frames: int, size: int, recompute: str, opts: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mm-calib-") as tmp:
        root = Path(tmp)
        write_job(
            root,
            argparse.Namespace(
                hidden=opts.hidden, layers=opts.layers, frames=latent_frames(frames), size=size
            ),
        )
        argv = [sys.executable, __file__, "--child", str(root), recompute, "--hidden", str(opts.hidden),
                "--layers", str(opts.layers), "--steps", str(opts.steps), "--warmup", str(opts.warmup),
                "--threads", str(opts.threads), "--device", opts.device] + (["--bf16"] if opts.bf16 else [])  # fmt: skip
        done = subprocess.run(
            argv, capture_output=True, text=True, check=True, cwd=ROOT, env=os.environ | env
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    p.add_argument(
        "--bf16", action="store_true", help="train with bf16 autocast (CUDA/NPU; the CPU ignores it)"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("ROOT", "RECOMPUTE"), help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child:
        print(json.dumps(child(Path(opts.child[0]), opts.child[1], opts)))
        return 0
    cpu = opts.device == "cpu"
    rate = matmul_rate(opts.threads) if cpu else None
    rows = []
    for frames, size, recompute in GRID:
        live = measure(frames, size, recompute, opts, LIVE if cpu else {})
        glibc = measure(frames, size, recompute, opts, {}) if cpu else None
        est_bytes, est_workspace, flops = estimate(frames, size, recompute, opts)
        rows.append({
            "frames": frames, "size": size, "recompute": recompute,
            "measured_mib": live["peak_bytes"] / MIB, "estimated_mib": est_bytes / MIB,
            "memory_error": est_bytes / live["peak_bytes"] - 1,
            # the same without the fixed part: what the model, its state and its activations add
            "training_error": (est_bytes - est_workspace) / (live["peak_bytes"] - live["workspace_bytes"]) - 1,
            "glibc_rss_mib": glibc["peak_bytes"] / MIB if glibc else None,
            "workspace_mib": live["workspace_bytes"] / MIB,
            "step_ms": 1000 * (glibc or live)["step_s"],
            "mfu": flops / (glibc or live)["step_s"] / rate if rate else None,
        })  # fmt: skip
    errors = [abs(r["memory_error"]) for r in rows]
    training = [abs(r["training_error"]) for r in rows]
    summary = {"median_error": statistics.median(errors), "worst_error": max(errors),
               "worst_training_error": max(training)}  # fmt: skip
    if opts.json:
        print(json.dumps({"matmul_gflops": rate / 1e9 if rate else None, "rows": rows} | summary, indent=2))
        return 0
    print(f"wandit hidden {opts.hidden} x {opts.layers} layers, {opts.device}, {opts.threads} threads"
          + (f"; fp32 matmul {rate / 1e9:.1f} GFLOP/s" if rate else ""))  # fmt: skip
    print(f"{'frames':>6} {'size':>5} {'recompute':>9} {'measured MiB':>13} {'estimate MiB':>13} {'error':>7} "
          f"{'w/o ws':>7} {'glibc RSS':>10} {'workspace':>10} {'step ms':>8} {'MFU':>5}")  # fmt: skip
    for r in rows:
        glibc = f"{r['glibc_rss_mib']:10.1f}" if r["glibc_rss_mib"] else f"{'-':>10}"
        mfu = f"{r['mfu']:5.2f}" if r["mfu"] else f"{'-':>5}"
        print(f"{r['frames']:>6} {r['size']:>5} {r['recompute']:>9} {r['measured_mib']:>13.1f} "
              f"{r['estimated_mib']:>13.1f} {100 * r['memory_error']:>+6.0f}% "
              f"{100 * r['training_error']:>+6.0f}% {glibc} {r['workspace_mib']:>10.1f} "
              f"{r['step_ms']:>8.0f} {mfu}")  # fmt: skip
    print(f"memory error: median {100 * summary['median_error']:.0f} %, worst {100 * summary['worst_error']:.0f} % "
          f"(goal within 20 %); without the workspace: worst {100 * summary['worst_training_error']:.0f} %")  # fmt: skip
    if rate:
        print(f"MFU of this CPU's matmul rate: median {statistics.median(r['mfu'] for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
