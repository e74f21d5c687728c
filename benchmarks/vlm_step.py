"""Training step time of the bundled VLM runtime against a plain transformers loop, same process, same run.

Both train transformers' `Qwen2_5_VLForConditionalGeneration` from the same tiny weights
(`runtime.synth_vlm.build_tiny_qwen25vl`), with the ViT (`model.visual.patch_embed`/`blocks`) and the projector
(`model.visual.merger`) frozen as the rendered model.json says, fp32 (no --bf16), one process, on
the same micro batches of the synthetic shapes data (`make_vlm_dataset`, prepared by `prepare_dataset`), in the
same order, with AdamW and gradient clipping at 1.0:
  * runtime: `runtime.vlm_train.VLMTrainer` built in-process from a real bundled job — the weights converted
    `hf_to_mm` by mm-agent's converter (`--load`), data.json / model.json written by `render_job` — and timed
    over its per-iteration work: `Trainer.step()` (data loader fetch: the record's image decoded and run
    through the image processor, `collate_vlm`; the all-masked check, forward with labels, backward, clip,
    AdamW, zero_grad, loss reduction) plus `TrainLog.record` (the Megatron line, losses.jsonl, TensorBoard);
  * baseline: the model loaded with `from_pretrained` from the same weights, the same parts frozen, and a plain
    loop over batches made beforehand by the same `runtime.vlmdata.VLMSource` + `collate_vlm` (preloaded in
    memory: no image decoding in the timed step): forward with labels, backward, `clip_grad_norm_`,
    `AdamW.step`, `zero_grad`, `loss.item()`.
After a warmup they take strict turns, one step each, the first mover rotated every step, so drift in machine
load hits both alike; the median step of each is reported with the ratio runtime / baseline (goal <= 1.05).
`--split` adds a third turn: the runtime's step with its data loader swapped for the baseline's preloaded
batches, which parts the runtime's per-step data cost (MindSpeed-MM decodes and processes each record's image
in every step) from the trainer's own.
On a machine with more runnable processes than cores, more than one torch thread makes these tiny steps stall in
OpenMP barriers (a 5 ms step's median can become 70-90 ms, its mean 250 ms, on 2 shared cores): use --threads 1
there, and read the load average printed beside the figures.

Peak memory: each side again alone in a child process (same job, `--memory-steps` steps after building), its
RSS high-water (VmHWM; see `peak_rss_mb`), as `Device.peak_memory_mb` reports it on CPU.
`--demo` also times `python -m mm_agent demo --vlm --json --dir <tmp> --device <--device>` as a user runs it (wall clock, goal
< 90 s on 2 quiet cores; its CPU seconds and the load average beside it) and prints its stage seconds, loss and
held-out accuracy before/after.

    python benchmarks/vlm_step.py [--images 16] [--hidden 64] [--layers 2] [--micro-batch-size 1]
                                  [--steps 60] [--warmup 5] [--threads N] [--num-workers 0]
                                  [--memory-steps 20] [--no-memory] [--split] [--demo] [--device cpu]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.device import guard_torch_npu  # noqa: E402

guard_torch_npu()

import torch  # noqa: E402

LR = "2e-3"


def prepare(root: Path, images: int, hidden: int, layers: int) -> None:
    """The bundled job as tests/test_vlm_train.py builds it: tiny weights, prepared data, conversion, render.
    `hidden`/`layers` size the LLM (4 query heads in 2 KV groups and the mrope split scaled as the 3B's 16/24/24
    of head_dim/2); the defaults are the demo's model."""
    from mm_agent.convert.engine import execute
    from mm_agent.convert.schema import ConvertRequest
    from mm_agent.dataset import DatasetRequest, prepare_dataset
    from mm_agent.render import RenderRequest, render_job
    from runtime.synth_vlm import TinyQwenVLConfig, build_tiny_qwen25vl, make_vlm_dataset

    half = hidden // 4 // 2  # head_dim / 2
    config = TinyQwenVLConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                              mrope_section=(half // 4, 3 * half // 8, 3 * half // 8))  # fmt: skip
    weights = build_tiny_qwen25vl(root / "weights", config, seed=0)
    made = make_vlm_dataset(root / "data", count=images, heldout=2, seed=0)
    prepare_dataset(
        DatasetRequest(dir=str(root / "data"), model="qwen2.5vl", task="sft", runtime="bundled",
                       index=str(made.train), confirm=True)
    )  # fmt: skip
    execute(ConvertRequest(converter="Qwen2_5_VLConverter", method="hf_to_mm", source=str(weights),
                           target=str(root / "converted"), confirm=True))  # fmt: skip
    render_job(
        RenderRequest(model="qwen2.5vl", task="sft", size="3b", runtime="bundled", out_dir=str(root / "job"),
                      weights_dir=str(weights), load_path=str(root / "converted"), dataset_dir=str(root / "data"),
                      dataset_file=str(root / "data" / "data.json"), npus_per_node=1, device="cpu", confirm=True)
    )  # fmt: skip


def trainer_argv(root: Path, opts: argparse.Namespace) -> list[str]:
    """tests/test_vlm_train.py's training flags, one process, no save during the timed steps."""
    mbs = str(opts.micro_batch_size)
    return [
        "--mm-data", str(root / "job" / "data.json"), "--mm-model", str(root / "job" / "model.json"),
        "--micro-batch-size", mbs, "--global-batch-size", mbs, "--num-workers", str(opts.num_workers),
        "--lr", LR, "--min-lr", LR, "--lr-decay-style", "constant", "--weight-decay", "0",
        "--clip-grad", "1.0", "--train-iters", str(10**6), "--seed", "7", "--seq-length", "1024",
        "--log-interval", str(10**6), "--load", str(root / "converted"), "--save", str(root / "save"),
        "--device", opts.device,
    ]  # fmt: skip


class Sides:
    """The runtime's trainer and the plain loop, each as a zero-argument iteration."""

    def __init__(self, root: Path, opts: argparse.Namespace, which: tuple[str, ...]) -> None:
        from runtime.device import pick_device
        from runtime.dist import init_distributed
        from runtime.train import parse_args
        from runtime.trainsets import StreamSampler

        self.args = parse_args(trainer_argv(root, opts))
        self.device = pick_device(self.args.device, 0, bf16=self.args.bf16)
        self.info = init_distributed(self.device)
        self.dev = self.device.torch_device
        self.sync: Callable[[], None] = (
            torch.cuda.synchronize if self.device.kind == "cuda" else (lambda: None)
        )
        self.trainer: Any = None
        self.model: Any = None
        if "runtime" in which:
            from runtime.vlm_train import VLMTrainer

            self.trainer = VLMTrainer(self.args, self.device, self.info)
        if "baseline" in which:
            from runtime.trainsets import RankSlice

            ranks = RankSlice(opts.micro_batch_size, 1, 1, 0)
            sampler = StreamSampler(0, ranks, self.args.seed, 0, shuffle=True)
            self._baseline(root, opts, sampler)

    def _baseline(self, root: Path, opts: argparse.Namespace, sampler: Any) -> None:
        from transformers import Qwen2_5_VLForConditionalGeneration

        from runtime.vlmdata import VLMSource, collate_vlm

        source = VLMSource(str(root / "job" / "data.json"), seq_length=self.args.seq_length)
        sampler.size = len(source)
        data_cfg = json.loads((root / "job" / "data.json").read_text())
        sampler.shuffle = bool((data_cfg.get("dataloader_param") or {}).get("shuffle", True))
        order = iter(sampler)  # the runtime loader's index stream: the same samples in the same order
        mbs = opts.micro_batch_size
        count = opts.warmup + opts.steps + 1
        self.batches = []
        for _ in range(count):
            items = [source[next(order)] for _ in range(mbs)]
            batch = collate_vlm(items, source.pad_token_id, source.label_pad_id)
            self.batches.append({k: v.to(self.dev) for k, v in batch.items()})
        torch.manual_seed(self.args.seed)
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(root / "weights"), dtype=torch.float32)
        torch.nn.Module.to(model, self.dev)  # in place (transformers types its own `to` for dtypes)
        model.train()  # from_pretrained returns eval mode
        for module in (model.model.visual.patch_embed, model.model.visual.blocks, model.model.visual.merger):
            module.requires_grad_(False)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        a = self.args
        self.optimizer = torch.optim.AdamW(
            self.params, lr=float(LR), betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps, weight_decay=0.0
        )
        self.counter = self.preloaded = 0

    def runtime_iteration(self) -> None:
        t = self.trainer
        s = t.step()
        t.log.record(s.iteration, t.consumed, s.seconds, s.lr, t.ranks.global_batch_size, s.loss, s.grad_norm,
                     s.skipped)  # fmt: skip

    def preloaded_iteration(self) -> None:
        """`runtime_iteration` with the trainer's data loader swapped for the baseline's preloaded batches
        (`--split`): the trainer's own cost without image decoding, the image processor and collation."""
        t, loader = self.trainer, self.trainer.batches
        batch = self.batches[self.preloaded % len(self.batches)]
        self.preloaded += 1
        t.batches = iter([batch])
        try:
            self.runtime_iteration()
        finally:
            t.batches = loader

    def baseline_iteration(self) -> None:
        batch = self.batches[self.counter % len(self.batches)]
        self.counter += 1
        loss = self.model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss.item()

    def close(self) -> None:
        from runtime.dist import destroy

        if self.trainer is not None:
            self.trainer.log.close()
        destroy()


def timed(fn: Callable[[], None], steps: int, sync: Callable[[], None]) -> list[float]:
    out = []
    for _ in range(steps):
        started = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - started)
    return out


def peak_rss_mb() -> float:
    """This process's RSS high-water in MiB: Linux's VmHWM, which exec starts afresh. (getrusage's ru_maxrss,
    which `Device.peak_memory_mb` reads, starts an exec'd child at its parent's high-water: a memory child
    of this process would report at least the parent's ~450 MiB.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(root: Path, side: str, opts: argparse.Namespace) -> int:
    """One side alone: build it, run --memory-steps steps, print its RSS high-water (MiB) as JSON."""
    before = peak_rss_mb()
    sides = Sides(root, opts, (side,))
    built = peak_rss_mb()
    fn = sides.runtime_iteration if side == "runtime" else sides.baseline_iteration
    timed(fn, opts.memory_steps, sides.sync)
    sides.close()
    print(json.dumps({"side": side, "import_mb": before, "built_mb": built, "peak_mb": peak_rss_mb()}))
    return 0


def memory(root: Path, opts: argparse.Namespace) -> dict[str, dict[str, float]]:
    out = {}
    for side in ("runtime", "baseline"):
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", str(root), side,
                "--micro-batch-size", str(opts.micro_batch_size), "--memory-steps", str(opts.memory_steps),
                "--warmup", "0", "--steps", str(opts.memory_steps), "--num-workers", str(opts.num_workers),
                "--device", opts.device, *(["--threads", str(opts.threads)] if opts.threads else [])]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode != 0:
            raise SystemExit(f"memory child {side} failed:\n{done.stderr[-3000:]}")
        out[side] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not every sandbox has /proc/loadavg
        return float("nan")


def demo(device: str) -> None:
    """`mm-agent demo --vlm --json` in a subprocess, as a user runs it: wall clock, CPU seconds of its process
    tree, peak RSS of the tree (sampled every 50 ms, as benchmarks/dataset_scan.py does), stages, loss, accuracy."""
    import threading

    import psutil

    with tempfile.TemporaryDirectory(prefix="mm-agent-vlm-demo-") as tmp:
        argv = [sys.executable, "-m", "mm_agent", "demo", "--vlm", "--json", "--dir", str(Path(tmp) / "demo"),
                "--device", device]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_before = load_average()
        started = time.perf_counter()
        proc = psutil.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        done, peak = threading.Event(), [0]

        def rss(p: psutil.Process) -> int:
            try:
                return int(p.memory_info().rss)
            except psutil.Error:
                return 0

        def sample() -> None:
            while not done.is_set():
                try:
                    kids = proc.children(recursive=True)
                except psutil.Error:
                    kids = []
                peak[0] = max(peak[0], rss(proc) + sum(rss(k) for k in kids))
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = proc.communicate()
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        print(
            f"demo --vlm exited {proc.returncode} without a JSON report:\n{err.decode(errors='replace')[-3000:]}"
        )
        return
    print(f"\ndemo --vlm: {wall:.1f} s wall (goal < 90 s on 2 quiet cores), {cpu:.1f} CPU s, load average "
          f"{load_before:.2f} before / {load_average():.2f} after, exit {proc.returncode}, ok {report['ok']}, "
          f"peak RSS of its process tree {peak[0] / 2**20:.0f} MiB")  # fmt: skip
    for stage in report["stages"]:
        print(f"  {stage['name']:10} {stage['seconds']:7.2f} s  {'ok ' if stage['ok'] else 'FAILED'}  "
              f"{stage['detail'][:90]}")  # fmt: skip
    figures = ("loss_first", "loss_last", "accuracy_before", "accuracy_after")
    if all(report.get(k) is not None for k in figures):
        print(f"  loss {report['loss_first']:.3f} -> {report['loss_last']:.3f} (means of {report['loss_window']} "
              f"logged losses); held-out accuracy {report['accuracy_before']:.3f} -> "
              f"{report['accuracy_after']:.3f} ({report['heldout']} questions)")  # fmt: skip
    if not report["ok"]:
        print(f"  message: {report['message']}")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--images", type=int, default=16, help="training images (two questions each)")
    p.add_argument(
        "--hidden", type=int, default=64, help="LLM hidden size, a multiple of 64 (the demo's: 64)"
    )
    p.add_argument("--layers", type=int, default=2, help="LLM layers (the demo's: 2)")
    p.add_argument(
        "--micro-batch-size", type=int, default=16, help="records per step (the demo's: 16 on one process)"
    )
    p.add_argument("--steps", type=int, default=60, help="timed steps per tool")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--num-workers", type=int, default=0, help="the runtime's data loader workers")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--memory-steps", type=int, default=20, help="steps each memory child runs")
    p.add_argument("--no-memory", action="store_true", help="skip the per-side peak memory children")
    p.add_argument("--demo", action="store_true", help="also time `mm-agent demo --vlm --json`")
    p.add_argument("--split", action="store_true",
                   help="also time the runtime with its loader swapped for the preloaded batches (data cost apart)")  # fmt: skip
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu", "auto"])
    p.add_argument("--child", nargs=2, metavar=("ROOT", "SIDE"), help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.child:
        return child(Path(opts.child[0]), opts.child[1], opts)

    with tempfile.TemporaryDirectory(prefix="mm-agent-vlm-step-") as tmp:
        root = Path(tmp)
        if opts.hidden % 64:
            p.error("--hidden must be a multiple of 64 (4 heads, mrope split of head_dim/2 in eighths)")
        prepare(root, opts.images, opts.hidden, opts.layers)
        sides = Sides(root, opts, ("runtime", "baseline"))
        cfg = sides.model.config
        text, vision = cfg.text_config, cfg.vision_config
        runtime_model: Any = sides.trainer.model
        batch = sides.batches[0]
        print(f"device {sides.dev} | tiny Qwen2.5-VL: LLM {text.num_hidden_layers} x {text.hidden_size}, ViT "
              f"{vision.depth} x {vision.hidden_size} ({sum(p.numel() for p in sides.model.parameters()) / 1e6:.2f}"
              f" M params, {sum(p.numel() for p in sides.params) / 1e6:.2f} M trainable) | batch "
              f"{tuple(batch['input_ids'].shape)} tokens, {tuple(batch['pixel_values'].shape)} patches | "
              f"attention runtime {runtime_model.config._attn_implementation}, baseline {cfg._attn_implementation}"
              f" | torch threads {torch.get_num_threads()} | load {load_average():.2f}")  # fmt: skip
        tools: dict[str, Callable[[], None]] = {
            "runtime": sides.runtime_iteration,
            "baseline": sides.baseline_iteration,
        }
        if opts.split:
            tools["runtime, batches preloaded"] = sides.preloaded_iteration
        for fn in tools.values():
            timed(fn, opts.warmup, sides.sync)
        times: dict[str, list[float]] = {name: [] for name in tools}
        names = list(tools)
        for step in range(
            opts.steps
        ):  # strict turns, first mover rotated each step: load drift hits all alike
            for name in names[step % len(names) :] + names[: step % len(names)]:
                times[name] += timed(tools[name], 1, sides.sync)
        sides.close()
        load_after = load_average()
        both_mb = peak_rss_mb()
        mem = {} if opts.no_memory else memory(root, opts)
    bl = statistics.median(times["baseline"])
    print(
        f"{'':27} {'median ms':>10} {'mean ms':>10} {'min ms':>10}   ({opts.steps} steps each, taking turns)"
    )
    for name, ts in times.items():
        print(f"{name:27} {1000 * statistics.median(ts):10.2f} {1000 * statistics.mean(ts):10.2f} "
              f"{1000 * min(ts):10.2f}")  # fmt: skip
    print(f"ratio runtime/baseline (median): {statistics.median(times['runtime']) / bl:.3f}  (goal <= 1.05) | "
          f"load average after {load_after:.2f}")  # fmt: skip
    if opts.split:
        print(f"ratio runtime with batches preloaded/baseline (median): "
              f"{statistics.median(times['runtime, batches preloaded']) / bl:.3f}  (the trainer without its data "
              f"pipeline)")  # fmt: skip
    print(f"peak RSS of this process (both sides built): {both_mb:.0f} MiB")
    for side, m in mem.items():
        print(f"peak RSS {side:8} alone: {m['peak_mb']:7.0f} MiB (after imports {m['import_mb']:.0f}, built "
              f"{m['built_mb']:.0f}; {opts.memory_steps} steps)")  # fmt: skip
    if opts.demo:
        demo(opts.device)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
