"""`mm-agent logs RUN [-n N] [-f]`: the end of a run's log; `-f` keeps printing until the run ends."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from mm_agent.jobs import job_status, tail_logs
from mm_agent.redact import redact

from .output import add_json_flag, print_json

POLL_S = 0.5


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "logs",
        help="last lines of a run's log (-f: follow until the run ends)",
        epilog="examples: mm-agent logs train-20261122-101500-a1b2c3 -n 50; mm-agent logs RUN -f",
    )
    p.add_argument("run_id", help="run id (see `mm-agent jobs`)")
    p.add_argument("-n", "--lines", type=int, default=100, help="lines to show (default 100, at most 500)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")
    add_json_flag(p)
    p.set_defaults(func=run)


def _follow(run_id: str, log: Path, offset: int) -> int:
    """Print what is appended after `offset` until the run is no longer running; Ctrl-C just detaches."""
    partial = b""
    try:
        while True:
            running = job_status(run_id, log_lines=0).state == "running"
            with log.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
            offset += len(data)
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            for raw in lines:
                print(redact(raw.decode("utf-8", "replace")), flush=True)
            if not running:
                if partial:
                    print(redact(partial.decode("utf-8", "replace")), flush=True)
                return 0
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        print(f"(stopped following; run {run_id} goes on)", file=sys.stderr)
        return 0


def run(args: argparse.Namespace) -> int:
    result = tail_logs(args.run_id, args.lines)
    if args.json:
        print_json(result)
        return 0
    for line in result.lines:
        print(line)
    if args.follow:
        return _follow(args.run_id, Path(result.log), result.size_bytes)
    return 0
