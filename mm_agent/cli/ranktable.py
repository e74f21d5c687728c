"""`mm-agent ranktable HOSTS_FILE`: build the HCCL rank table (hccl.json) of a multi-node job.

A dry run by default (prints the table and where it would go); `--yes` writes it. Exit 0 on success; a bad
hosts file or hccn.conf is an error with the fix (exit 2, from `main`).
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from mm_agent.ranktable import RankTableRequest, build_ranktable, render_table

from .output import add_json_flag, console, option_error, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ranktable",
        help="build an HCCL rank table (hccl.json) from a hosts file and each node's /etc/hccn.conf",
        epilog="hosts file: one node per line in node-rank order, '<server_ip> [hccn_conf_path]' (default "
        "<server_ip>.hccn.conf next to the hosts file; copy it with scp <node>:/etc/hccn.conf <ip>.hccn.conf)\n"
        "example: mm-agent ranktable hosts.txt --devices 8 --out jobs/wan21/hccl.json --yes\n"
        "then: export RANK_TABLE_FILE=<that file> on every node, and mm-agent validate <job> checks it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "hosts_file", metavar="HOSTS_FILE", help="one '<server_ip> [hccn_conf_path]' line per node"
    )
    p.add_argument(
        "--devices",
        type=int,
        help="NPUs per node, devices 0..N-1 (default: every device in each hccn.conf; must agree across nodes)",
    )
    p.add_argument("--out", default="hccl.json", help="rank table file to write (default ./hccl.json)")
    p.add_argument(
        "--yes",
        action="store_true",
        help="write the file (default: dry run; never overwrites a file mm-agent did not write)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        req = RankTableRequest(
            hosts_file=args.hosts_file, devices=args.devices, out=args.out, confirm=args.yes
        )
    except ValidationError as exc:
        raise option_error(exc, "ranktable") from exc
    result = build_ranktable(req)
    if args.json:
        print_json(result)
        return 0
    out = console()
    out.print(render_table(result.table).decode(), markup=False, end="")
    verb = {"dry run": "would write", "written": "wrote", "unchanged": "unchanged:"}[result.state]
    out.print(
        f"{verb} {result.out}: {result.nnodes} node(s) x {result.npus_per_node} NPU(s) = {result.world_size} ranks",
        markup=False,
    )
    if result.state == "dry run":
        out.print("dry run: add --yes to write it", markup=False)
    return 0
