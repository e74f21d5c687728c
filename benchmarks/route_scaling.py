"""route_model's time against the length of the request, on adversarial inputs, new against old.

A 300 K-character request once stalled the server for 45 s: the HF-id regex rescanned a long run of id
characters from every position in it, and every version-looking match split the whole text before it.
This times the router at doubling sizes on inputs built to hit each pass's worst case, up to the request
cap (`mm_agent.fields.REQUEST_CHARS`, through `route_model`) and far beyond it (through `_parse`, the
internals every pass runs in), next to the implementation of a git revision (HEAD by default) loaded
as a module. `x lin` is the time over what linear scaling from the smallest size predicts: near 1 (or
below) is linear, growing with the size is superlinear.

    .venv/bin/python benchmarks/route_scaling.py [--rev HEAD] [--max 320000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from mm_agent import route
from mm_agent.fields import REQUEST_CHARS
from mm_agent.registry import get_registry

REPO = Path(__file__).resolve().parent.parent

# Each builds a text of exactly n characters aimed at one pass of the parser.
INPUTS: dict[str, Callable[[int], str]] = {
    "id run, no slash": lambda n: ("a-" * n)[:n],  # HF-id regex: one long run that never reaches "/"
    "slashes": lambda n: ("a/" * n)[:n],  # HF-id regex: many short ids, none known
    "known HF ids": lambda n: ("qwen/qwen2.5-vl-7b-instruct " * n)[:n],  # every id found and consumed
    "pinned versions": lambda n: ("torch 2.1.0 " * n)[:n],  # version pass: a look-back per match
    "separator run": lambda n: "wan" + "." * (n - 6) + "2.1",  # compact form: one gap next to matches
    "aliases": lambda n: ("wan2.1 t2v 8 npus 1.3b " * n)[:n],  # alias / task / size passes, all hit
    "digits": lambda n: ("1" * n)[:n],  # size and count regexes on one digit run
    "rehearsal words": lambda n: ("没有npu 本机 on this machine no npus " * n)[:n],  # rehearsal pass, all hit
}


def _show(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout


def load_baseline(rev: str) -> ModuleType:
    """`mm_agent/route.py` as of git `rev`, imported under another name beside the current one, reading
    the vocabulary of that revision (a newer vocabulary.yaml may hold sections its model refuses)."""
    folder = Path(tempfile.mkdtemp(prefix="route_baseline_"))
    (folder / "vocabulary.yaml").write_text(
        _show(rev, "mm_agent/registry/data/vocabulary.yaml"), encoding="utf-8"
    )
    path = folder / "route_baseline.py"
    path.write_text(_show(rev, "mm_agent/route.py"), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("route_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["route_baseline"] = module
    spec.loader.exec_module(module)
    setattr(module, "DATA_DIR", folder)  # noqa: B010  (only load_vocabulary reads it)
    return module


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Best of `repeat` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def runner(module: ModuleType, text: str, full: bool) -> Callable[[], object]:
    """The whole tool (request model bypassed, as the cap would refuse long texts) or only the parser."""
    if full:
        return lambda: module.route_model(module.RouteRequest.model_construct(text=text))
    return lambda: module._parse(text, get_registry(), module.load_vocabulary())


def sizes(top: int) -> list[int]:
    out, n = [], 1000
    while n <= top:
        out.append(n)
        n *= 2
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", default="HEAD", help="git revision of the baseline (default HEAD)")
    parser.add_argument("--max", type=int, default=320_000, help="largest text, in characters")
    parser.add_argument("--repeat", type=int, default=3, help="runs per point; the best is kept")
    parser.add_argument(
        "--baseline-limit",
        type=float,
        default=5.0,
        help="stop timing the baseline on an input once one size took longer than this (seconds)",
    )
    args = parser.parse_args()
    old = load_baseline(args.rev)
    for module in (route, old):  # registry, vocabulary and regex caches filled before any timing
        runner(module, "fine-tune wan2.1 t2v on 8 npus", True)()
    print(f"route_model / _parse time by request size; baseline = {args.rev}; cap = {REQUEST_CHARS} chars")
    for name, build in INPUTS.items():
        print(f"\n{name}")
        print(f"{'chars':>8} {'via':>7} {'new s':>9} {'x lin':>6} {'old s':>9} {'x lin':>6}")
        base: dict[str, tuple[int, float]] = {}
        old_done = False
        for n in sizes(args.max):
            text = build(n)
            full = n <= REQUEST_CHARS
            via = "route" if full else "_parse"
            cells = []
            for label, module in (("new", route), ("old", old)):
                if label == "old" and old_done:
                    cells.append(f"{'-':>9} {'':>6}")
                    continue
                seconds = timed(runner(module, text, full), args.repeat)
                first = base.get(f"{label}{via}")
                if first is None:
                    base[f"{label}{via}"] = first = (n, seconds)
                ratio = seconds / (first[1] * n / first[0]) if first[1] > 0 else float("nan")
                cells.append(f"{seconds:9.4f} {ratio:6.2f}")
                if label == "old" and seconds > args.baseline_limit:
                    old_done = True
            print(f"{n:>8} {via:>7} {cells[0]} {cells[1]}")


if __name__ == "__main__":
    main()
