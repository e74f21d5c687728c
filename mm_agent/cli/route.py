"""`mm-agent route TEXT`: plain request -> model, task, backend and pipeline."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from mm_agent.route import RouteRequest, route_model

from .output import add_json_flag, console, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "route",
        help="turn a plain request into model, task, backend and pipeline",
        epilog='examples: mm-agent route "fine-tune Wan2.1 text-to-video on 8 NPUs"\n'
        '          mm-agent route "把Qwen2.5-VL做多模态理解微调" --json\n'
        '          mm-agent route "qwen2.5-vl-7b sft" --npus 16          # 16 in all: 2 nodes x 8\n'
        '          mm-agent route "qwen2.5-vl-7b sft" --npus-per-node 8 --nnodes 2',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("text", help="the request, in English or Chinese")
    p.add_argument("--model", help="model id hint")
    p.add_argument("--task", help="task hint (t2v, i2v, sft, ...)")
    p.add_argument("--mm-version", help="MindSpeed-MM version")
    p.add_argument(
        "--npus", type=int, help="TOTAL NPUs over all nodes (16 = 2 nodes x 8), as route_model's npus"
    )
    p.add_argument("--npus-per-node", type=int, help="NPUs on each node")
    p.add_argument("--nnodes", "--nodes", dest="nnodes", type=int, help="number of nodes")
    p.add_argument(
        "--runtime",
        choices=["mindspeed-mm", "bundled"],
        default="mindspeed-mm",
        help="pipeline for MindSpeed-MM's scripts or mm-agent's bundled runtime (Wan-family t2v, Qwen2.5-VL)",
    )
    p.add_argument(
        "--detail", action="store_true", help="every candidate's pipeline in --json (default: the best one's)"
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = route_model(
        RouteRequest(
            request=args.text,
            model=args.model,
            task=args.task,
            mm_version=args.mm_version,
            npus=args.npus,
            npus_per_node=args.npus_per_node,
            nnodes=args.nnodes,
            runtime=args.runtime,
            detail=args.detail,
        )
    )
    if args.json:
        print_json(result)
        return 0
    out = console()
    if result.question:
        out.print(f"[yellow]?[/yellow] {escape(result.question)}")
    if result.new_model is not None:
        new = result.new_model
        out.print(f"your own model: scaffold MindSpeed-MM's new-model flow from {new.base}", markup=False)
        out.print(f"   $ {new.command}          # dry run; --yes writes", markup=False)
        out.print(f"   $ {new.demo}   # rehearse the scaffolded model here; steps: {new.doc}", markup=False)
    for i, c in enumerate(result.candidates, 1):
        avail = (
            ""
            if c.available_in_version
            else f" [red](not in MM {c.mm_version}; try {c.suggested_version})[/red]"
        )
        layout = f"{c.nnodes} node(s) x {c.npus_per_node} NPUs"
        task = f"{c.task} of the {c.adapts} model" if c.adapts else c.task
        out.print(f"[bold]{i}. {c.model_id}[/bold] {task} on {c.backend}, size {c.size}, {layout}{avail}")
        out.print(f"   {c.explanation}")
        if c.fit:
            out.print(f"   memory: {c.fit}", markup=False)
        if i == 1:
            for stage in c.pipeline:
                if stage.applies:
                    out.print(f"   [cyan]{stage.stage}[/cyan]: {stage.summary}")
                    for cmd in stage.commands:
                        out.print(f"      $ {cmd}", markup=False)
    return 0
