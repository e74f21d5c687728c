"""`mm-agent estimate MODEL|JOB_DIR`: memory per device and step time before launch, with the levers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from mm_agent.estimate import EstimateRequest, EstimateResult, estimate_resources
from mm_agent.estimate.schema import Sharding

from .output import add_json_flag, console, option_error, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="will a job fit its NPUs, and how long a step takes (memory itemised, levers)",
        epilog="examples: mm-agent estimate wan2.1 --size 14b --npus 8 --frames 81 --height 480 --width 832\n"
        "          mm-agent estimate wan2.1 --size 14b --npus 1 --sharding none --json\n"
        "          mm-agent estimate ./jobs/wan14b          # a rendered job directory",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", help="registry model id, or a rendered job directory")
    p.add_argument("--size", help="size id, e.g. 1.3b, 14b (default: the model's first)")
    p.add_argument("--task", help="t2v, i2v, sft, lora, ... (default: the model's first)")
    p.add_argument("--npus", type=int, help="devices in all (default: the size's stock layout)")
    p.add_argument("--tp", type=int, help="tensor parallel size")
    p.add_argument("--cp", type=int, help="context (Ulysses) parallel size")
    p.add_argument(
        "--frames", type=int, help="video frames (default: the stock example's, e.g. 81 for Wan2.1)"
    )
    p.add_argument("--height", type=int, help="pixels (default: the stock example's; VLM image 448)")
    p.add_argument("--width", type=int, help="pixels (default: the stock example's; VLM image 448)")
    p.add_argument("--text-len", type=int, help="text tokens per sample")
    p.add_argument("--recompute", choices=["full", "none"], help="activation recompute (default full)")
    p.add_argument(
        "--sharding",
        choices=list(get_args(Sharding)),
        help="what is sharded over data parallel ranks (default: the stock layout's)",
    )
    p.add_argument(
        "--lora", action=argparse.BooleanOptionalAction, default=None, help="adapter-only training"
    )
    p.add_argument("--device", help="910b (default), 910b1..910b4, 910c, atlas-a3, a100, h100, h200, ...")
    p.add_argument("--train-iters", type=int, help="iterations, for the run's time")
    p.add_argument("--dataset-size", type=int, help="samples, for the time per epoch")
    add_json_flag(p)
    p.set_defaults(func=run)


FLAGS: tuple[str, ...] = ("size", "task", "npus", "tp", "cp", "frames", "height", "width", "text_len")
FLAGS += ("recompute", "sharding", "lora", "device", "train_iters", "dataset_size")


def run(args: argparse.Namespace) -> int:
    is_job = Path(args.target, "job.yaml").is_file() or "/" in args.target
    values = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    values["job_dir" if is_job else "model"] = args.target
    try:
        req = EstimateRequest(**values)
    except ValidationError as exc:
        raise option_error(exc, "estimate") from exc
    result = estimate_resources(req)
    if args.json:
        print_json(result)
        return 0
    _print(result)
    return 0


def _print(r: EstimateResult) -> None:
    out = console()
    verdict = "[green]fits[/green]" if r.fits else "[red]does not fit[/red]"
    out.print(
        f"[bold]{r.model} {r.size}[/bold] {r.task}: {r.per_device_gb:g} of {r.device_gb:g} GB per {r.device} "
        f"device — {verdict}"
    )
    out.print(
        f"  {r.npus} devices: TP {r.tp} x PP {r.pp} x CP {r.cp} x DP {r.dp}, sharding {r.sharding}, "
        f"recompute {r.recompute}{', LoRA' if r.lora else ''}; {r.seq_tokens:,} tokens/sample"
    )
    for name, gb in r.breakdown.items():
        out.print(f"  {name:<16} {gb:>8.2f} GB", markup=False)
    if r.step_seconds is not None:
        extra = f", run {r.run_hours:g} h" if r.run_hours is not None else ""
        extra += f", epoch {r.epoch_hours:g} h" if r.epoch_hours is not None else ""
        out.print(f"  step {r.step_seconds:g} s (global batch {r.global_batch}){extra}", markup=False)
    for lever in r.levers:
        mark = "fits" if lever.fits else "still over"
        out.print(f"  -> {lever.change}: {lever.per_device_gb:g} GB ({mark})", markup=False)
