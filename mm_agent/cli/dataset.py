"""`mm-agent dataset DIR --model M --task T [--out FILE] [--yes] [--json]`: a folder of clips or images (or an
index file) -> a checked MindSpeed-MM dataset index. Dry run unless --yes; a progress bar on stderr."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from mm_agent.dataset import DatasetRequest, DatasetResult, prepare_dataset
from mm_agent.errors import MMAgentError

from .output import add_json_flag, console, option_error, print_json

SHOWN = 20  # rejected files listed without --json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "dataset",
        help="check a folder of videos/images (or an index) and write its MindSpeed-MM dataset index",
        epilog="example: mm-agent dataset data/clips --model wan2.1 --task t2v --yes",
    )
    p.add_argument("dir", help="dataset root: the folder of videos or images (searched recursively)")
    p.add_argument("--model", required=True, help="registry model id, e.g. wan2.1, qwen2.5vl")
    p.add_argument("--task", help="task id (default: the model's first)")
    p.add_argument("--size", help="model size id (default: the first)")
    p.add_argument("--mm-version", help="MindSpeed-MM version (default: the registry's)")
    p.add_argument(
        "--runtime",
        choices=["mindspeed-mm", "bundled"],
        help="what will read the dataset (default: the job's, else mindspeed-mm)",
    )
    p.add_argument(
        "--job", dest="job_dir", help="a rendered job: its configs set the limits the items must meet"
    )
    p.add_argument(
        "--index", help="CSV/JSONL/JSON of path + caption (VLMs: conversations) instead of sidecars"
    )
    p.add_argument("--path-column", help="index column holding the media path (default: detected)")
    p.add_argument("--caption-column", help="index column holding the caption (default: detected)")
    p.add_argument(
        "--out",
        help="index file to write (default: DIR/data.json, DIR/data.jsonl for CogVideoX/Step-Video: what render reads)",
    )
    p.add_argument("--num-frames", type=int, help="frames per clip (default: the job's)")
    p.add_argument("--frame-interval", type=int, help="frame sampling interval (default: the job's)")
    p.add_argument("--max-height", type=int, help="frame height the job trains at (default: the job's)")
    p.add_argument("--max-width", type=int, help="frame width the job trains at (default: the job's)")
    p.add_argument("--text-len", type=int, help="caption tokens the text encoder keeps (default: the job's)")
    p.add_argument("--workers", type=int, help="probe processes (default: the CPU count)")
    p.add_argument("--yes", action="store_true", help="write the index (default: dry run, nothing written)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _request(args: argparse.Namespace) -> DatasetRequest:
    names = set(DatasetRequest.model_fields) - {"confirm"}  # (--workers is how it runs: passed apart)
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    try:
        return DatasetRequest(**given, confirm=args.yes)
    except ValidationError as exc:
        raise option_error(exc, "dataset") from None


def run(args: argparse.Namespace) -> int:
    req = _request(args)
    if args.workers is not None and not 1 <= args.workers <= 64:
        raise MMAgentError(
            f"{args.workers} workers", field="--workers", fix="use 1 to 64 (default: the CPU count)"
        )
    result = _with_progress(req, args.workers)
    if args.json:
        print_json(result)
    else:
        _show(result)
    return 0 if result.ok else 1


def _with_progress(req: DatasetRequest, workers: int | None) -> DatasetResult:
    """The scan with a progress bar on stderr (stdout stays the result)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("probing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=None)

        def on_progress(done: int, total: int, current: str) -> None:
            bar.update(task, completed=done, total=total or None, description=current[-40:])

        return prepare_dataset(req, on_progress=on_progress, workers=workers)


def _show(r: DatasetResult) -> None:
    out = console()
    verb = f"wrote {r.written}" if r.written else f"dry run: would write {r.index}"
    out.print(
        f"{r.kind}: {r.accepted} accepted, {len(r.rejected)} rejected of {r.stats.found} ({verb})",
        markup=False,
    )
    for rej in r.rejected[:SHOWN]:
        out.print(f"  [red]rejected[/] {rej.path}: {rej.reason}", markup=True, highlight=False)
        out.print(f"      fix: {rej.fix}", markup=False)
    if len(r.rejected) > SHOWN:
        out.print(f"  ... {len(r.rejected) - SHOWN} more (--json lists all)", markup=False)
    s = r.stats
    if s.duration_s:
        out.print(
            f"duration s: min {s.duration_s.min}, median {s.duration_s.p50}, max {s.duration_s.max}",
            markup=False,
        )
    if s.resolutions:
        out.print("sizes: " + ", ".join(f"{k} ({v})" for k, v in s.resolutions.items()), markup=False)
    out.print(f"probed {s.probed}, from cache {s.cached}, {s.seconds} s", markup=False)
    for w in r.warnings:
        out.print(f"[yellow]warning[/] {w}", markup=True, highlight=False)
    if r.plot:
        out.print(f"summary plot: {r.plot}", markup=False)
    for step in r.next_steps:
        out.print(f"next: {step}", markup=False)
