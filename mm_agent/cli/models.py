"""`mm-agent models`: list the registry."""

from __future__ import annotations

import argparse
from typing import Any

from mm_agent.catalog import ListModelsRequest, list_models

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "models", help="list MindSpeed-MM models", epilog="example: mm-agent models --family vlm"
    )
    p.add_argument(
        "--family",
        choices=["vlm", "generative", "omni", "audio", "post-training"],
        help="only models of this family",
    )
    p.add_argument("--task", help="only models with this task (t2v, i2v, sft, dpo, grpo, ...)")
    p.add_argument(
        "--backend",
        choices=["megatron", "megatron+fsdp2", "fsdp2-native", "accelerate+deepspeed", "custom"],
        help="only models with a task on this training backend",
    )
    p.add_argument("--mm-version", help="MindSpeed-MM version to check availability against")
    p.add_argument("--available-only", action="store_true", help="hide models absent from --mm-version")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = list_models(
        ListModelsRequest(
            family=args.family,
            task=args.task,
            backend=args.backend,
            mm_version=args.mm_version,
            include_unavailable=not args.available_only,
        )
    )
    if args.json:
        print_json(result)
        return 0
    from rich.table import Table

    table = Table(title=f"MindSpeed-MM models ({result.count}, availability for {result.mm_version})")
    for col in ("id", "family", "tasks", "sizes", "converter", "versions"):
        table.add_column(col)
    for m in result.models:
        tasks = ", ".join(f"{t.task}/{t.backend}" for t in m.tasks)
        mark = "" if m.available_in_version else " [red](absent)[/red]"
        table.add_row(m.id + mark, m.family, tasks, ", ".join(m.sizes), m.converter or "-", m.versions)
    console().print(table)
    return 0
