"""`mm-agent convert CONVERTER METHOD`: convert weights the way `mm-convert` does, with a plan first.

CONVERTER and METHOD are MindSpeed-MM's names, so commands read like the upstream docs. Without `--yes`
it prints the plan (layout, memory/disk estimate, the equivalent mm-convert command) and writes nothing;
with `--yes` it starts the conversion as a background run and follows it with a progress bar. Ctrl-C
stops the worker it started (and only that one).
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from pydantic import TypeAdapter, ValidationError

from mm_agent.convert import ConvertPlan, ConvertReport, ConvertRequest, convert_weights, final_report
from mm_agent.errors import MMAgentError
from mm_agent.procs import StopRequest, stop_process
from mm_agent.runs import RunStatus, RunStatusRequest, run_status, wait_run
from mm_agent.units import human_bytes

from .output import add_json_flag, console, option_error, print_json

_LAYERS: TypeAdapter[list[int] | list[list[int]]] = TypeAdapter(list[int] | list[list[int]])


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help="convert weights HF <-> MindSpeed-MM (plan first; --yes converts)",
        description="Convert weights with MindSpeed-MM's converter names. WanConverter and "
        "Qwen2_5_VLConverter run natively (streaming, atomic, with a manifest); other converters run "
        "mm-convert. Without --yes only the plan is shown.",
        epilog="examples:\n"
        "  mm-agent convert WanConverter hf_to_mm --source Wan2.1-T2V-1.3B-Diffusers/transformer "
        "--target ckpt/wan-mm --pp-layers 7,8,8,7\n"
        "  mm-agent convert WanConverter mm_to_hf --source save_dir --target out --hf-dir "
        "Wan2.1-T2V-1.3B-Diffusers/transformer --yes\n"
        "  mm-agent convert Qwen2_5_VLConverter hf_to_mm --source Qwen2.5-VL-7B-Instruct --target "
        "ckpt/qwen-mm --pp-layers 12,16 --vit-pp-layers 32,0 --yes\n"
        "  mm-agent convert WanConverter merge_lora_to_base --source ckpt/wan-mm --lora save_dir --target "
        "ckpt/wan-merged --lora-rank 16 --lora-alpha 16 --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("converter", help="MindSpeed-MM converter class, e.g. WanConverter")
    p.add_argument("method", help="converter method, e.g. hf_to_mm, mm_to_hf, resplit")
    p.add_argument("--source", required=True, help="HF dir (hf_to_mm) or MM checkpoint dir")
    p.add_argument(
        "--target", required=True, help="output dir (may equal --source for the Wan in-place form)"
    )
    p.add_argument("--hf-dir", help="original HF dir: mm_to_hf copies config.json and index files from it")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the MM layout (default 1)")
    p.add_argument("--source-tp", type=int, help="resplit: TP of the source (default: read from it)")
    p.add_argument(
        "--pp-layers",
        metavar="LIST",
        help="layers per PP stage: 7,8,8,7 or '[[3,4,4,4],[3,4,4,4]]' (VPP); VLMs: the LLM layers",
    )
    p.add_argument("--vit-pp-layers", metavar="LIST", help="VLMs: ViT layers per PP stage (ViT first)")
    p.add_argument(
        "--lora", metavar="DIR", help="merge_lora_to_base: the LoRA checkpoint (training --save dir)"
    )
    p.add_argument("--lora-rank", type=int, help="merge_lora_to_base: LoRA rank (default 8, as mm-convert)")
    p.add_argument(
        "--lora-alpha", type=int, help="merge_lora_to_base: LoRA alpha (default 16, as mm-convert)"
    )
    p.add_argument("--converter-version", metavar="V", help="mm-convert init arg --version (e.g. i2v, v1.5)")
    p.add_argument("--verify", action="store_true", help="compare source and converted weights numerically")
    p.add_argument("--yes", action="store_true", help="convert (default: show the plan only)")
    add_json_flag(p)
    p.set_defaults(func=run)


def parse_layers(text: str | None, flag: str) -> list[int] | list[list[int]] | None:
    """`7,8,8,7`, `[7,8,8,7]` or `[[3,4],[4,3]]` -> the list; anything else is a usage error."""
    if text is None:
        return None
    raw = text.strip()
    try:
        value: Any = json.loads(raw) if raw.startswith("[") else [int(x) for x in raw.split(",") if x.strip()]
        return _LAYERS.validate_python(value, strict=True)
    except (ValueError, ValidationError):
        raise MMAgentError(
            f"cannot read {flag} {text!r}",
            field=flag,
            fix=f"write {flag} 7,8,8,7 (PP) or {flag} '[[3,4,4,4],[3,4,4,4]]' (VPP)",
        ) from None


def _request(args: argparse.Namespace) -> ConvertRequest:
    fields = {
        "converter": args.converter,
        "method": args.method,
        "source": args.source,
        "target": args.target,
        "hf_dir": args.hf_dir,
        "tp": args.tp,
        "source_tp": args.source_tp,
        "pp_layers": parse_layers(args.pp_layers, "--pp-layers"),
        "vit_pp_layers": parse_layers(args.vit_pp_layers, "--vit-pp-layers"),
        "lora_path": args.lora,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "converter_version": args.converter_version,
        "verify": args.verify,
        "confirm": args.yes,
    }
    try:
        return ConvertRequest(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise option_error(exc, "convert") from None


def _layers(groups: list[list[int]]) -> str:
    spans = [f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups if g]
    return "layers " + " | ".join(spans) if spans else ""


def print_plan(plan: ConvertPlan) -> None:
    out = console()
    how = "native" if plan.native else "runs mm-convert"
    out.print(f"[bold]{plan.converter} {plan.method}[/bold] ({how})")
    out.print(f"  {plan.source} -> {plan.target}", markup=False)
    if plan.layout:
        out.print(f"layout ({len(plan.layout)} file(s)):")
        for f in plan.layout:
            sizes = f"  {f.keys} keys  {human_bytes(f.bytes)}" if f.keys else ""
            out.print(f"  {f.path}  {_layers(f.layers)}{sizes}", markup=False)
    est = plan.estimate
    if est is not None:
        verdict = "[green]fits[/green]" if est.fits else f"[red]does not fit[/red]: {est.reason}"
        out.print(
            f"estimate: source {human_bytes(est.source_bytes)}, output {human_bytes(est.output_bytes)}, peak memory "
            f"{human_bytes(est.peak_memory_bytes)} (available {human_bytes(est.free_memory_bytes)}), free disk "
            f"{human_bytes(est.free_disk_bytes)}: {verdict}"
        )
    if plan.mm_convert_argv:
        out.print(f"mm-convert equivalent: {shlex.join(plan.mm_convert_argv)}", markup=False)
    for note in plan.notes:
        out.print(f"note: {note}", markup=False)


def print_report(report: ConvertReport) -> None:
    out = console()
    colour = {"converted": "green", "unchanged": "green", "failed": "red"}.get(report.status, "blue")
    out.print(f"[{colour}]{report.status}[/]: {report.message}")
    if report.status in ("converted", "unchanged"):
        peak = (
            f", peak anonymous memory {human_bytes(report.peak_rss_bytes)}" if report.peak_rss_bytes else ""
        )
        out.print(
            f"{report.keys_converted} keys converted, {len(report.keys_dropped)} dropped, "
            f"{len(report.files)} file(s), {human_bytes(report.bytes_written)} written in {report.seconds:.1f} s{peak}"
        )
    reasons: dict[str, int] = {}
    for change in report.keys_dropped:
        reasons[change.reason or "no reason given"] = reasons.get(change.reason or "no reason given", 0) + 1
    for reason, count in reasons.items():
        out.print(f"  dropped {count} key(s): {reason}", markup=False)
    for warning in report.warnings:
        out.print(f"warning: {warning}", markup=False)
    for f in report.files:
        pp = f" pp {f.pp_rank}" if f.pp_rank is not None else ""
        out.print(
            f"  {f.path}  tp {f.tp_rank}{pp}  {_layers(f.layers)}  {f.keys} keys  {human_bytes(f.bytes)}",
            markup=False,
        )
    if report.verify is not None:
        v = report.verify
        parts = [f"max abs diff {v.max_abs_diff:g}" if v.max_abs_diff is not None else ""]
        parts.append(
            f"round trip bitwise: {v.round_trip_bitwise}" if v.round_trip_bitwise is not None else ""
        )
        shown = ", ".join(p for p in parts if p)
        out.print(
            f"verify: {'[green]ok[/green]' if v.ok else '[red]FAILED[/red]'} {shown} ({v.dtype or '?'})"
        )
        for line in v.details:
            out.print(f"  {line}", markup=False)


def _follow(report: ConvertReport, quiet: bool) -> ConvertReport:
    """Progress bar over progress.json until the worker ends; Ctrl-C stops it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    assert report.run_id is not None
    run_id = report.run_id
    out = Console(stderr=True, highlight=False) if quiet else console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=out, transient=True) as bar:
            task = bar.add_task("starting", total=None)

            def update(status: RunStatus) -> None:
                p = status.progress
                bar.update(
                    task, completed=p.done, total=p.total or None, description=p.message[:60] or "working"
                )

            final = wait_run(run_id, update)
    except KeyboardInterrupt:
        pid = run_status(RunStatusRequest(run_id=run_id, log_lines=0)).pid
        stopped = stop_process(StopRequest(pid=pid, confirm=True, timeout_s=10))
        out.print(
            f"interrupted: {stopped.message}; run {run_id} is stopped, its target was not completed",
            markup=False,
        )
        raise
    return final_report(final, report.plan)


def run(args: argparse.Namespace) -> int:
    report = convert_weights(_request(args))
    if report.status == "dry_run":
        if args.json:
            print_json(report)
        else:
            print_plan(report.plan)
            console().print("dry run: nothing was written; convert with --yes", markup=False)
        return 0
    if not args.json:
        print_plan(report.plan)
        console().print(report.message, markup=False)
    try:
        final = _follow(report, quiet=args.json)
    except KeyboardInterrupt:
        return 130
    if args.json:
        print_json(final)
    else:
        print_report(final)
    return 1 if final.status == "failed" else 0
