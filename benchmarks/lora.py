"""LoRA against full fine-tuning of the same Wan `wandit` in the bundled runtime: step time, peak memory, share.

One invocation trains the same model (same config, same base weights, same feature files) twice, each in
its own child process so that one's peak memory cannot hide the other's:
  * full: `runtime.train.Trainer` with `--load BASE` (every parameter trained, AdamW state for all);
  * lora: the same plus MindSpeed-MM's Wan2.1 flags `--lora-r 16 --lora-alpha 16 --lora-target-modules
    ffn.2 ffn.0 proj_q proj_k proj_v proj_out` (base frozen, adapter trained).
Each child times `Trainer.step()` (data fetch, forward, loss, backward, clip, AdamW) after a warmup and
reports the median; peak memory is the process's peak RSS above its RSS just before the Trainer was built
(on CUDA/NPU: the device's max allocated bytes), and the training state is counted exactly (parameters,
gradients, optimizer state). The table puts them side by side with lora / full ratios.

    python benchmarks/lora.py [--hidden 512] [--layers 4] [--rank 16] [--steps 20] [--warmup 3]
                              [--threads 2] [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = ["ffn.2", "ffn.0", "proj_q", "proj_k", "proj_v", "proj_out"]  # finetune_lora.sh (Wan2.1)


def write_job(root: Path, opts: argparse.Namespace) -> None:
    """benchmarks/runtime_overhead.py's feature files and configs (64-token, 256-wide captions) plus a release
    base checkpoint: the wandit's seeded initial weights."""
    import torch
    from runtime_overhead import write_job as write_features

    from runtime.wandit import WanDiT, WanDiTConfig

    predictor = write_features(root, argparse.Namespace(**vars(opts), text_dim=256, text_len=64))
    torch.manual_seed(0)
    model = WanDiT(WanDiTConfig.from_predictor(predictor, "pretrain_model.json"))
    (root / "base/release/mp_rank_00").mkdir(parents=True)
    torch.save({"model": model.state_dict()}, root / "base/release/mp_rank_00/model_optim_rng.pt")
    (root / "base/latest_checkpointed_iteration.txt").write_text("release")


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(root: Path, mode: str, opts: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Train `mode` (with `extra` runtime.train flags) for warmup + steps iterations in this process and
    measure it (benchmarks/estimate_calibration.py uses it too)."""
    import torch

    from runtime.device import pick_device
    from runtime.dist import destroy, init_distributed
    from runtime.train import Trainer, parse_args

    torch.set_num_threads(opts.threads)
    argv = ["--mm-data", str(root / "feature_data.json"), "--mm-model", str(root / "pretrain_model.json"),
            "--lr", "1e-4", "--lr-decay-style", "constant", "--train-iters", str(10**6), "--log-interval", str(10**6),
            "--num-workers", "0", "--global-batch-size", "1", "--load", str(root / "base"), "--device", opts.device]  # fmt: skip
    argv += list(extra)
    if mode == "lora":
        argv += [
            "--lora-r",
            str(opts.rank),
            "--lora-alpha",
            str(opts.rank),
            "--lora-target-modules",
            *TARGETS,
        ]
    args = parse_args(argv)
    device = pick_device(args.device, 0, bf16=False)
    info = init_distributed(device)
    accel = device.kind in ("cuda", "npu")
    module = getattr(torch, device.kind) if accel else None
    before = rss_bytes()
    trainer = Trainer(args, device, info)
    built = rss_bytes()
    times = []
    for index in range(opts.warmup + opts.steps):
        started = time.perf_counter()
        trainer.step()
        if module is not None:
            module.synchronize()
        if index >= opts.warmup:
            times.append(time.perf_counter() - started)
    params = list(trainer.model.parameters())
    trainable = [p for p in params if p.requires_grad]
    optim_bytes = sum(
        t.numel() * t.element_size()
        for state in trainer.optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = module.max_memory_allocated() if module is not None else peak_rss - before
    destroy()
    return {
        "mode": mode,
        "step_ms": 1000 * statistics.median(times),
        "peak_bytes": peak,
        "rss_before": before,  # the process before the Trainer (interpreter, torch, runtime modules)
        "rss_built": built,  # and once it is built (the model loaded, no step taken)
        "peak_rss": peak_rss,
        "weight_bytes": sum(p.numel() * p.element_size() for p in params),
        "params": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in trainable),
        # parameters + gradients of the trainable ones + optimizer state
        "state_bytes": sum(p.numel() * p.element_size() for p in params)
        + sum(p.numel() * p.element_size() for p in trainable)
        + optim_bytes,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--frames", type=int, default=3, help="latent frames")
    p.add_argument("--size", type=int, default=128, help="video height = width in pixels (latents / 8)")
    p.add_argument("--rank", type=int, default=16, help="--lora-r (alpha = r, as the stock Wan2.1 script)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu", "auto"])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--child", nargs=2, metavar=("ROOT", "MODE"), help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child:
        print(json.dumps(child(Path(opts.child[0]), opts.child[1], opts)))
        return 0
    flags = [f"--{k}={v}" for k, v in vars(opts).items() if k not in ("json", "child")]
    with tempfile.TemporaryDirectory(prefix="mm-agent-lora-bench-") as tmp:
        root = Path(tmp)
        write_job(root, opts)
        results = {}
        for mode in ("full", "lora"):
            done = subprocess.run([sys.executable, __file__, *flags, "--child", str(root), mode],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    summary = {
        "config": {k: v for k, v in vars(opts).items() if k not in ("json", "child")},
        "full": full,
        "lora": lora,
        "ratio_step_time": lora["step_ms"] / full["step_ms"],
        "ratio_peak_memory": lora["peak_bytes"] / full["peak_bytes"],
        "ratio_state_memory": lora["state_bytes"] / full["state_bytes"],
        "trainable_share": lora["trainable"] / lora["params"],
    }
    if opts.json:
        print(json.dumps(summary))
        return 0
    mib = 1024**2
    print(f"wandit hidden {opts.hidden} x {opts.layers} layers, {full['params'] / 1e6:.2f} M params | LoRA r={opts.rank} "
          f"on {' '.join(TARGETS)} | {opts.device}, {opts.threads} threads, median of {opts.steps} steps")  # fmt: skip
    print(f"{'':6} {'step ms':>9} {'peak MiB':>9} {'state MiB':>10} {'trainable':>12}")
    for row in (full, lora):
        print(f"{row['mode']:6} {row['step_ms']:9.1f} {row['peak_bytes'] / mib:9.1f} {row['state_bytes'] / mib:10.1f} "
              f"{row['trainable']:12,}")  # fmt: skip
    print(f"lora/full: step time {summary['ratio_step_time']:.3f} | peak memory {summary['ratio_peak_memory']:.3f} | "
          f"training state {summary['ratio_state_memory']:.3f} | trainable share {100 * summary['trainable_share']:.2f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
