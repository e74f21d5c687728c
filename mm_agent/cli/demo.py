"""`mm-agent demo`: the whole pipeline end to end on synthetic data, with a live line per stage.

A thin adapter over `mm_agent.demo.run_demo`: it shows the stages as they run (rich progress on stderr
with `--json`, so stdout stays one JSON document) and ends with a summary table, or with the `DemoReport`
as JSON. Exit status 0 only when the report says ok.
"""

from __future__ import annotations

import argparse
from typing import Any

from mm_agent.demo import STAGES, DemoReport, DemoRequest, StageEvent, run_demo
from mm_agent.demo_newmodel import NEW_MODEL_STAGES, run_new_model_demo
from mm_agent.demo_vlm import VLM_DEFAULTS, VLM_STAGES, run_vlm_demo
from mm_agent.errors import MMAgentError

from .output import add_json_flag, console, option_error, print_json

_DEFAULTS = DemoRequest()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline end to end on synthetic data (about 2 minutes on 2 CPU cores)",
        description="Synthesise a small video-caption dataset and tiny Wan2.1 weights, then route, render "
        "(bundled runtime), validate, convert hf_to_mm, extract features and train (torchrun), sample an "
        "mp4 and diagnose the training log, through the same functions the MCP tools call. With --vlm: "
        "images and questions and tiny Qwen2.5-VL weights; convert, measure held-out accuracy, train, "
        "evaluate, export mm_to_hf, answer with transformers' generate, and diagnose.",
        epilog="examples: mm-agent demo; mm-agent demo --dir /tmp/demo --clips 4 --iters 20 --json; "
        "mm-agent demo --lora; mm-agent demo --vlm; mm-agent demo --vlm --lora; mm-agent demo --new-model",
    )
    p.add_argument(
        "--dir",
        default=_DEFAULTS.dir,
        help="demo directory (default ./mm-agent-demo); each run gets a new run-<time> folder in it; "
        "a non-empty directory that is not a demo directory is refused",
    )
    p.add_argument(
        "--clips",
        type=int,
        help=f"synthetic clips (default {_DEFAULTS.clips}); --vlm: training images (default {VLM_DEFAULTS['clips']})",
    )
    p.add_argument(
        "--iters",
        type=int,
        help=f"training iterations (default {_DEFAULTS.iters}; --vlm: {VLM_DEFAULTS['iters']})",
    )
    p.add_argument(
        "--nproc", type=int, default=_DEFAULTS.nproc, help=f"torchrun processes (default {_DEFAULTS.nproc})"
    )
    p.add_argument(
        "--device",
        choices=["auto", "npu", "cuda", "cpu"],
        default=_DEFAULTS.device,
        help="runtime device (default auto: NPU, then CUDA, then CPU)",
    )
    p.add_argument(
        "--lora",
        action="store_true",
        help="train a LoRA adapter on the frozen base (MindSpeed-MM's --lora-* flags) and measure a short "
        "full fine-tune of the same job beside it (trainable share, peak memory, step time)",
    )
    p.add_argument(
        "--vlm",
        action="store_true",
        help="rehearse Qwen2.5-VL fine-tuning (images of shapes + questions, tiny weights; with --lora: an adapter)",
    )
    p.add_argument(
        "--new-model",
        action="store_true",
        help="rehearse MindSpeed-MM's new-model flow: scaffold a tiny DiT of your own (mm-agent new-model) "
        "and train it here",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def _request(args: argparse.Namespace) -> DemoRequest:
    from pydantic import ValidationError

    try:
        given = {k: v for k, v in (("clips", args.clips), ("iters", args.iters)) if v is not None}
        if args.new_model and (args.vlm or args.lora):
            raise MMAgentError(
                "--new-model trains your own DiT: it does not combine with --vlm or --lora",
                field="--new-model",
                fix="drop --vlm/--lora",
            )
        return DemoRequest(
            dir=args.dir,
            nproc=args.nproc,
            device=args.device,
            lora=args.lora,
            vlm=args.vlm,
            new_model=args.new_model,
            **given,
        )
    except ValidationError as exc:
        raise option_error(exc, "demo") from None


def print_summary(report: DemoReport) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"mm-agent demo: {report.run_dir}", title_justify="left")
    table.add_column("stage")
    table.add_column("", justify="center")
    table.add_column("seconds", justify="right")
    table.add_column("result", overflow="fold")
    for s in report.stages:
        table.add_row(
            s.name, "[green]ok[/green]" if s.ok else "[red]FAIL[/red]", f"{s.seconds:.1f}", s.detail
        )
    out.print(table)
    a = report.artifacts
    for label, path in (
        ("sample", a.sample),
        ("exported model", a.exported),
        ("your model's files", a.code),
        ("held-out answers", a.evaluation),
        ("loss curve", a.loss_curve),
        ("checkpoint", a.checkpoint),
        ("training log", a.train_log),
        ("tensorboard", a.tensorboard),
        ("report", a.report),
    ):
        if path:
            out.print(f"  {label}: {path}", markup=False)
    if report.loss_first is not None and report.loss_last is not None:
        out.print(
            f"  loss {report.loss_first:.4f} -> {report.loss_last:.4f} "
            f"(mean of the first and last {report.loss_window} logged losses)",
            markup=False,
        )
    if report.accuracy_before is not None and report.accuracy_after is not None:
        out.print(
            f"  held-out exact match {100 * report.accuracy_before:.0f}% -> {100 * report.accuracy_after:.0f}% "
            f"({report.heldout} questions)",
            markup=False,
        )
    if report.lora is not None:
        f = report.lora
        peaks = (
            f"; peak {f.peak_mb:.0f} MiB vs {f.full_peak_mb:.0f} MiB full ({f.memory})"
            if f.peak_mb and f.full_peak_mb
            else ""
        )
        steps = f"; step {f.step_ms:.0f} vs {f.full_step_ms:.0f} ms" if f.step_ms and f.full_step_ms else ""
        beside = f" (full fine-tune: {f.full_iters} iterations)" if f.full_iters else ""
        out.print(
            f"  LoRA trains {f.trainable_params:,} of {f.total_params:,} parameters ({f.trainable_share:.2f}%)"
            f"{peaks}{steps}{beside}",
            markup=False,
        )
    colour = "green" if report.ok else "red"
    out.print(f"[{colour}]{'PASSED' if report.ok else 'FAILED'}[/] in {report.seconds:.0f} s: ", end="")
    out.print(report.message, markup=False)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
    from rich.table import Column

    req = _request(args)
    out = Console(stderr=True, highlight=False) if args.json else console()
    columns = (
        TextColumn("{task.fields[mark]}", table_column=Column(width=1, no_wrap=True)),
        TextColumn("{task.description}", table_column=Column(width=8, no_wrap=True)),
        BarColumn(bar_width=16),
        TextColumn("{task.fields[count]}", table_column=Column(width=7, no_wrap=True, justify="right")),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}", markup=False, table_column=Column(ratio=1, no_wrap=True)),
    )
    with Progress(*columns, console=out, transient=False, expand=True) as bar:
        tasks: dict[str, TaskID] = {
            name: bar.add_task(name, total=1, start=False, mark="·", count="", detail="")
            for name in (VLM_STAGES if req.vlm else NEW_MODEL_STAGES if req.new_model else STAGES)
        }

        def on_event(event: StageEvent) -> None:
            task = tasks[event.stage]
            if event.state == "start":
                bar.start_task(task)
                bar.update(task, mark="▶", total=None)
            elif event.state == "progress":
                count = f"{event.done or 0}/{event.total}" if event.total else ""
                bar.update(
                    task, completed=event.done or 0, total=event.total, count=count, detail=event.detail[:50]
                )
            else:
                ok = event.state == "done"
                bar.update(task, mark="✓" if ok else "✗", detail=event.detail, total=1, completed=int(ok))
                bar.stop_task(task)

        runner = run_vlm_demo if req.vlm else run_new_model_demo if req.new_model else run_demo
        report = runner(req, on_event)
    if args.json:
        print_json(report)
    else:
        print_summary(report)
    return 0 if report.ok else 1
