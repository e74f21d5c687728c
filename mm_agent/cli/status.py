"""`mm-agent status RUN`: one run's state, progress (iteration/loss/ETA), root cause and log tail."""

from __future__ import annotations

import argparse
from typing import Any

from .jobs import show_one
from .output import add_json_flag


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="state of one run: progress, loss, ETA, root cause when failed, log tail",
        epilog="example: mm-agent status train-20261122-101500-a1b2c3",
    )
    p.add_argument("run_id", help="run id (from `mm-agent train/extract --yes` or `mm-agent jobs`)")
    p.add_argument("--lines", type=int, default=20, help="log lines to show (default 20, at most 500)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return show_one(args.run_id, args.lines, args.json)
