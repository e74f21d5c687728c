"""Two hosts against one, same run: the bundled runtime's training as `torchrun --nnodes 2` (gloo), one node per
network namespace joined by a veth pair (tests/twohosts.py), against `torchrun --nproc_per_node 2` on one
host, with the same global batch over the same features (tests/test_runtime_train.py's tiny job). Prints
the start-up time (launch -> first iteration line), the whole wall time, and whether the losses agree
bit for bit. Needs root and iproute2 (it says so otherwise).

    python benchmarks/multinode.py [--iters 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_runtime_train import env, losses, torchrun, train_args, write_job  # noqa: E402
from twohosts import node_argv, two_hosts, unavailable  # noqa: E402


def _timed(procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    """Seconds to the first iteration line on rank 0's stdout, and to the end of every process."""
    t0, first = time.perf_counter(), None
    assert procs[0].stdout is not None
    for line in procs[0].stdout:
        if first is None and " iteration " in line:
            first = time.perf_counter() - t0
    codes = [p.wait(timeout=600) for p in procs]
    return {"startup_s": round(first or 0.0, 2), "wall_s": round(time.perf_counter() - t0, 2), "exit": codes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if (why := unavailable()) is not None:
        raise SystemExit(f"cannot build two hosts here: {why}")
    with tempfile.TemporaryDirectory(prefix="mm-nodes-") as tmp:
        job = write_job(Path(tmp) / "job")
        popen = {
            "env": env(),
            "cwd": ROOT,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.DEVNULL,
            "text": True,
        }
        one = _timed(
            [subprocess.Popen([*torchrun(2), *train_args(job, Path(tmp) / "one", iters=args.iters)], **popen)]
        )
        with two_hosts() as (a, b):
            port = 29000 + os.getpid() % 900
            procs = []
            for rank, host in enumerate((a, b)):
                argv = [
                    *node_argv(host, rank, a, port),
                    *train_args(job, Path(tmp) / "two", iters=args.iters),
                ]
                procs.append(subprocess.Popen(argv, **popen))
            two = _timed(procs)
        same = losses(Path(tmp) / "one") == losses(Path(tmp) / "two")
    figures = {
        "one_host_2_ranks": one,
        "two_hosts_1_rank_each": two,
        "losses_equal": same,
        "iters": args.iters,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{'layout':<26}{'start-up s':>12}{'wall s':>9}  exit")
    for name, fig in (("1 host x 2 ranks", one), ("2 hosts x 1 rank (netns)", two)):
        print(f"{name:<26}{fig['startup_s']:>12}{fig['wall_s']:>9}  {fig['exit']}")
    print(f"losses bit for bit equal over {args.iters} iterations: {same}")
    print(f"two hosts / one host: start-up {two['startup_s'] / max(one['startup_s'], 1e-9):.2f}x, "
          f"wall {two['wall_s'] / max(one['wall_s'], 1e-9):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
