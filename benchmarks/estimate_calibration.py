"""The estimator against measurement: the bundled runtime trains a small Wan DiT on this machine over a grid of
shapes (frames x resolution x recompute on/off), each in a process of its own, and `mm_agent.estimate` is asked
about the same model and shape; both are printed side by side with the error.

  * memory: how far the process's peak RSS rose above what it held before the trainer was built (the
    interpreter, torch and the data loader are not the model's), against the estimator's weights + gradients +
    optimizer + activations for a device that trains in fp32 (the bundled runtime on CPU; devices.yaml `cpu`);
  * step time: the median step against the estimator's FLOPs per step over this CPU's measured fp32 matmul
    rate (so the printed MFU is what the runtime reached of it).
Goal (issue 18): memory within +-20 % on CPU. The same script takes `--device cuda|npu` on an accelerator,
where the memory measured is the device's peak allocated memory.

    python benchmarks/estimate_calibration.py [--hidden 384] [--layers 4] [--steps 5] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
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
    (frames, size, recompute) for frames in (17, 33) for size in (96, 128) for recompute in ("none", "full")
]
MIB = 1 << 20


def child(root: Path, recompute: str, opts: argparse.Namespace) -> dict[str, Any]:
    """Train in this process for warmup + steps iterations (benchmarks/lora.py's full fine-tune, with
    recompute when asked): peak memory above the start and the median step."""
    got = train_child(root, "full", opts, ("--recompute-granularity", "full") if recompute == "full" else ())
    return {"step_s": got["step_ms"] / 1000, "peak_bytes": got["peak_bytes"]}


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


def estimate(frames: int, size: int, recompute: str, opts: argparse.Namespace) -> tuple[float, float]:
    """(bytes, FLOPs per step) the estimator gives for the benchmark's DiT and shape, trained in fp32."""
    from mm_agent.estimate.flops import flops_per_sample
    from mm_agent.estimate.memory import GB, Layout, breakdown
    from mm_agent.estimate.model import ModelShape, wan_tower
    from mm_agent.estimate.tokens import count_tokens

    arch = {"hidden_size": opts.hidden, "ffn_dim": 4 * opts.hidden, "num_layers": opts.layers,
            "text_dim": 256, "freq_dim": 256, "in_dim": 16, "out_dim": 16, "patch_size": [1, 2, 2]}  # fmt: skip
    shape = ModelShape(
        kind="video", main=wan_tower(arch), vit=None, cross_attention=True, vocab=0, encoders=0.0,
        vae_stride=(4, 8, 8), patch=(1, 2, 2), default_text_len=64, source="benchmark arch",
    )  # fmt: skip
    tokens = count_tokens(shape, frames, size, size, 64)
    lay = Layout(npus=1, tp=1, pp=1, cp=1, mbs=1, recompute=recompute, sharding="none", lora=False,  # type: ignore[arg-type]
                 online_encoders=False, fp32=opts.device == "cpu")  # fmt: skip
    parts = breakdown(shape, tokens, lay, workspace_gb=0.0)
    return sum(parts.values()) * GB, flops_per_sample(shape, tokens, lay)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("ROOT", "RECOMPUTE"), help=argparse.SUPPRESS)
    p.add_argument("--frames", type=int, default=17, help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=96, help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child:
        print(json.dumps(child(Path(opts.child[0]), opts.child[1], opts)))
        return 0
    rate = matmul_rate(opts.threads)
    rows = []
    for frames, size, recompute in GRID:
        with tempfile.TemporaryDirectory(prefix="mm-calib-") as tmp:
            root = Path(tmp)
            job = argparse.Namespace(hidden=opts.hidden, layers=opts.layers, frames=frames, size=size)
            write_job(root, job)
            argv = [sys.executable, __file__, "--child", str(root), recompute, "--frames", str(frames),
                    "--size", str(size), "--hidden", str(opts.hidden), "--layers", str(opts.layers),
                    "--steps", str(opts.steps), "--warmup", str(opts.warmup), "--threads", str(opts.threads),
                    "--device", opts.device]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
            got = json.loads(done.stdout.strip().splitlines()[-1])
        est_bytes, flops = estimate(frames, size, recompute, opts)
        rows.append({
            "frames": frames, "size": size, "recompute": recompute,
            "measured_mib": got["peak_bytes"] / MIB, "estimated_mib": est_bytes / MIB,
            "memory_error": est_bytes / got["peak_bytes"] - 1,
            "step_ms": 1000 * got["step_s"], "mfu": flops / got["step_s"] / rate,
        })  # fmt: skip
    if opts.json:
        print(json.dumps({"matmul_gflops": rate / 1e9, "rows": rows}, indent=2))
        return 0
    print(f"wandit hidden {opts.hidden} x {opts.layers} layers, {opts.device}, {opts.threads} threads; "
          f"fp32 matmul {rate / 1e9:.1f} GFLOP/s")  # fmt: skip
    print(f"{'frames':>6} {'size':>5} {'recompute':>9} {'measured MiB':>13} {'estimate MiB':>13} {'error':>7} "
          f"{'step ms':>8} {'MFU':>5}")  # fmt: skip
    for r in rows:
        print(f"{r['frames']:>6} {r['size']:>5} {r['recompute']:>9} {r['measured_mib']:>13.1f} "
              f"{r['estimated_mib']:>13.1f} {100 * r['memory_error']:>+6.0f}% {r['step_ms']:>8.0f} {r['mfu']:>5.2f}")  # fmt: skip
    errors = [abs(r["memory_error"]) for r in rows]
    print(
        f"memory error: median {100 * statistics.median(errors):.0f} %, worst {100 * max(errors):.0f} % "
        f"(goal within 20 %); MFU of this CPU's matmul rate: median {statistics.median(r['mfu'] for r in rows):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
