"""Training step time of the bundled runtime against a minimal hand-written PyTorch loop, same process, same run.

Both train the same `wandit` (same config, same seeded initial weights) on the same data with AdamW and
gradient clipping at 1.0, one process:
  * runtime: `runtime.train.Trainer` built from real config files (feature_data.json / pretrain_model.json,
    feature .pt files written here), timed over its per-iteration work — `Trainer.step()` (data loader
    fetch, seeded timestep/noise draw, forward, weighted flow-matching MSE, backward, clip, AdamW, loss
    reduction) plus `TrainLog.record` (the Megatron line, losses.jsonl, TensorBoard scalars);
  * baseline: a plain loop over the same samples preloaded in memory (no file reads): draw timestep/noise, forward, the same loss,
    backward, `clip_grad_norm_`, `AdamW.step`, `zero_grad`, `loss.item()`.
After a warmup they take strict turns, one step each, the first mover swapped every step, so drift in machine
load hits both alike; the median step of each is reported with the ratio runtime / baseline (goal <= 1.05).

    python benchmarks/runtime_overhead.py [--hidden 256] [--layers 4] [--frames 5] [--size 128]
                                          [--steps 60] [--warmup 5] [--num-workers 0] [--threads N]
                                          [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.device import guard_torch_npu

guard_torch_npu()

import torch  # noqa: E402

from runtime.device import pick_device  # noqa: E402
from runtime.dist import destroy, init_distributed  # noqa: E402
from runtime.flow import FlowConfig, FlowMatching  # noqa: E402
from runtime.train import Trainer, micro_generator, parse_args  # noqa: E402
from runtime.wandit import WanDiT, WanDiTConfig  # noqa: E402

DIFFUSION = {"model_id": "wan_flow_match_scheduler", "num_train_timesteps": 1000, "shift": 5, "sigma_min": 0.0,
             "extra_one_step": True}  # fmt: skip


def write_job(root: Path, opts: argparse.Namespace) -> dict[str, object]:
    heads = max(1, opts.hidden // 64)
    predictor = {
        "model_id": "wandit", "model_type": "t2v", "patch_size": [1, 2, 2], "in_dim": 16, "out_dim": 16,
        "hidden_size": opts.hidden, "num_heads": heads, "ffn_dim": 4 * opts.hidden, "freq_dim": 256,
        "text_dim": opts.text_dim, "num_layers": opts.layers, "qk_norm": True, "cross_attn_norm": True,
        "eps": 1e-6, "max_seq_len": 1024,
    }  # fmt: skip
    folder = root / "sora_features"
    (folder / "features").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    lines = []
    for i in range(8):
        name = f"features/clip{i:04d}.pt"
        torch.save(
            {
                "video": torch.randn(16, opts.frames, opts.size // 8, opts.size // 8, generator=g),
                "prompt_ids": torch.randn(opts.text_len, opts.text_dim, generator=g),
                "prompt_mask": torch.ones(opts.text_len, dtype=torch.long),
            },
            folder / name,
        )
        lines.append(json.dumps({"path": f"clip{i}.mp4", "cap": "c", "file": name}))
    (folder / "data.jsonl").write_text("\n".join(lines) + "\n")
    data = {"dataset_param": {"dataset_type": "feature",
                              "basic_parameters": {"data_path": str(folder / "data.jsonl"), "data_folder": str(folder)}}}  # fmt: skip
    (root / "feature_data.json").write_text(json.dumps(data))
    (root / "pretrain_model.json").write_text(json.dumps({"diffusion": DIFFUSION, "predictor": predictor}))
    return predictor


def timed(fn: object, steps: int, sync: object) -> list[float]:
    out = []
    for _ in range(steps):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        sync()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--frames", type=int, default=5, help="latent frames")
    p.add_argument("--size", type=int, default=128, help="video height = width in pixels (latents / 8)")
    p.add_argument("--text-len", type=int, default=64)
    p.add_argument("--text-dim", type=int, default=256)
    p.add_argument("--steps", type=int, default=60, help="timed steps per tool")
    p.add_argument("--num-workers", type=int, default=0, help="the runtime's data loader workers")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu", "auto"])
    opts = p.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)

    with tempfile.TemporaryDirectory(prefix="mm-agent-overhead-") as tmp:
        root = Path(tmp)
        predictor = write_job(root, opts)
        args = parse_args([
            "--mm-data", str(root / "feature_data.json"), "--mm-model", str(root / "pretrain_model.json"),
            "--lr", "1e-4", "--lr-decay-style", "constant", "--weight-decay", "0.01", "--clip-grad", "1.0",
            "--train-iters", str(10**6), "--log-interval", str(10**6), "--num-workers", str(opts.num_workers),
            "--micro-batch-size", "1", "--global-batch-size", "1", "--seed", "1234", "--save", str(root / "save"),
            "--device", opts.device,
        ])  # fmt: skip
        device = pick_device(args.device, 0, bf16=args.bf16)
        info = init_distributed(device)
        dev = device.torch_device
        sync = torch.cuda.synchronize if device.kind == "cuda" else (lambda: None)

        trainer = Trainer(args, device, info)

        def runtime_iteration() -> None:
            s = trainer.step()
            trainer.log.record(
                s.iteration, trainer.consumed, s.seconds, s.lr, 1, s.loss, s.grad_norm, s.skipped
            )

        torch.manual_seed(args.seed)
        model = WanDiT(WanDiTConfig.from_predictor(predictor, "pretrain_model.json")).to(dev)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        flow = FlowMatching(FlowConfig.from_diffusion(DIFFUSION, "inline", training=True))
        batches = []
        for path in sorted((root / "sora_features/features").glob("*.pt")):
            feature = torch.load(path)
            batches.append(
                (feature["video"].unsqueeze(0).to(dev), feature["prompt_ids"].unsqueeze(0).to(dev))
            )
        counter = [0]

        def baseline_iteration() -> None:
            counter[0] += 1
            latents, text = batches[counter[0] % len(batches)]
            x_t, timestep, target, weight = flow.draw(latents, micro_generator(1234, counter[0], 0, 0))
            loss = FlowMatching.loss(model(x_t, timestep, text), target, weight)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()

        params = sum(p.numel() for p in model.parameters())
        tokens = opts.frames * (opts.size // 16) ** 2
        print(f"device {dev} | wandit hidden {opts.hidden} x {opts.layers} layers ({params / 1e6:.2f} M params) | "
              f"{tokens} video tokens, {opts.text_len} text tokens | torch threads {torch.get_num_threads()}")  # fmt: skip
        timed(runtime_iteration, opts.warmup, sync)
        timed(baseline_iteration, opts.warmup, sync)
        runtime_times: list[float] = []
        baseline_times: list[float] = []
        for step in range(
            opts.steps
        ):  # strict alternation, first mover swapped each step: load drift hits both
            pair = [(runtime_times, runtime_iteration), (baseline_times, baseline_iteration)]
            for times, fn in pair if step % 2 == 0 else pair[::-1]:
                times += timed(fn, 1, sync)
        trainer.log.close()
        destroy()
    rt, bl = statistics.median(runtime_times), statistics.median(baseline_times)
    print(
        f"{'':10} {'median ms':>10} {'mean ms':>10} {'min ms':>10}   ({len(runtime_times)} steps each, alternating)"
    )
    for name, times in (("runtime", runtime_times), ("baseline", baseline_times)):
        print(f"{name:10} {1000 * statistics.median(times):10.2f} {1000 * statistics.mean(times):10.2f} "
              f"{1000 * min(times):10.2f}")  # fmt: skip
    print(f"ratio runtime/baseline (median): {rt / bl:.3f}  (goal <= 1.05)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
