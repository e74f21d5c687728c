"""MCP latency of mm-agent, side by side with the reference server `mcp-server-time`, same client, same run.

Measures, over real stdio subprocesses:
  * cold start: spawn -> `initialize` answered -> `tools/list` answered (median of --starts runs, mm-agent's
    and the reference's alternating, so a busy machine slows both). mm-agent answers tools/list from the list
    it remembered at an earlier start with the same code (mm_agent/toollist.py) and loads its tools meanwhile;
    the start with nothing remembered (the first after an install or upgrade) is measured too, as is the first
    answer: spawn -> tools/list -> the first tool call answered (route_model; the reference's get_current_time),
    which waits for the tools to load;
  * p50/p99 of --calls rounds, each calling `route_model` and `validate_configs` (mm-agent) and then
    `get_current_time` (reference) over sessions open side by side, so both see the same machine load.
    validate_configs checks the demo's job: Wan2.1 t2v 1.3b with the bundled runtime, rendered through the
    server with a dataset as `mm-agent demo` does (12 files).
Prints the figures and the ratios mm-agent / reference. Targets (issue 29): cold start <= 1.2x,
route_model p50 <= 1.3x, validate_configs p50 <= 3x. To see where a cold start goes:
`python -X importtime -m mm_agent serve --help 2>imports.txt`.

    python benchmarks/mcp_latency.py [--calls 50] [--starts 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def cold_start(
    params: StdioServerParameters, first_call: tuple[str, dict[str, Any]] | None = None
) -> float:
    """Seconds from spawn to tools/list answered (and, with `first_call`, that call answered too)."""
    start = time.perf_counter()
    async with Client(params) as client:
        await client.list_tools()
        if first_call is not None:
            result = await client.call_tool(*first_call)
            if result.is_error:
                raise SystemExit(f"{first_call[0]} failed: {result.content}")
        return time.perf_counter() - start


def _with_cache(params: StdioServerParameters, folder: Path) -> StdioServerParameters:
    return params.model_copy(
        update={"env": {"PATH": os.environ.get("PATH", ""), "MM_AGENT_CACHE_DIR": str(folder)}}
    )


async def interleaved(
    mm: StdioServerParameters, ref: StdioServerParameters, calls: list[tuple[str, dict[str, Any]]], n: int
) -> tuple[dict[str, list[float]], list[float]]:
    """n rounds, each timing every mm-agent call then the reference call, over two open sessions: both
    servers are measured under the same load (a busy machine slows both, not one of them)."""
    out: dict[str, list[float]] = {tool: [] for tool, _ in calls}
    ref_times: list[float] = []
    async with Client(mm) as m, Client(ref) as r:
        for tool, args in calls:
            await m.call_tool(tool, args)  # warm-up
        await r.call_tool("get_current_time", {"timezone": "UTC"})
        for _ in range(n):
            for tool, args in calls:
                t0 = time.perf_counter()
                result = await m.call_tool(tool, args)
                out[tool].append(time.perf_counter() - t0)
                if result.is_error:
                    raise SystemExit(f"{tool} failed: {result.content}")
            t0 = time.perf_counter()
            await r.call_tool("get_current_time", {"timezone": "UTC"})
            ref_times.append(time.perf_counter() - t0)
    return out, ref_times


async def main(calls: int, starts: int) -> None:
    with tempfile.TemporaryDirectory() as ws:
        mm = StdioServerParameters(
            command=sys.executable, args=["-m", "mm_agent", "serve", "--workspace", ws], cwd=str(ROOT)
        )
        mm = _with_cache(mm, Path(ws) / "cache")  # this run's own remembered list
        ref = StdioServerParameters(
            command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]
        )

        # the demo's job to validate (bundled runtime, a dataset), rendered through the server itself
        (Path(ws) / "data").mkdir()
        (Path(ws) / "data" / "data.json").write_text(
            json.dumps([{"path": "clips/0.mp4", "cap": "a cat on the grass"}]), encoding="utf-8"
        )
        async with Client(mm) as client:
            r = await client.call_tool(
                "render_job",
                {
                    "model": "wan2.1",
                    "task": "t2v",
                    "size": "1.3b",
                    "runtime": "bundled",
                    "npus_per_node": 1,
                    "dataset_dir": "data",
                    "dataset_file": "data/data.json",
                    "out_dir": "job",
                    "confirm": True,
                },
            )
            assert not r.is_error, r.content

        mm_cold: list[float] = []
        ref_cold: list[float] = []
        mm_fresh: list[float] = []
        mm_first: list[float] = []
        ref_first: list[float] = []
        route = ("route_model", {"request": "fine-tune Wan2.1 text-to-video on 8 NPUs"})
        clock = ("get_current_time", {"timezone": "UTC"})
        for i in range(starts):  # alternating: all see the same load
            mm_cold.append(await cold_start(mm))
            ref_cold.append(await cold_start(ref))
            mm_fresh.append(await cold_start(_with_cache(mm, Path(ws) / f"empty-{i}")))  # nothing remembered
            mm_first.append(await cold_start(mm, route))
            ref_first.append(await cold_start(ref, clock))
        timed, ref_calls = await interleaved(
            mm,
            ref,
            [route, ("validate_configs", {"paths": ["job"]})],
            calls,
        )
        routed, validate = timed["route_model"], timed["validate_configs"]

    ms = 1000.0
    print(f"{'measure':<34}{'mm-agent':>12}{'mcp-server-time':>18}{'ratio':>9}")
    cold_m, cold_r = statistics.median(mm_cold), statistics.median(ref_cold)
    for label, mine, theirs in (
        ("cold start to tools/list (median)", cold_m, cold_r),
        ("  the same, nothing remembered", statistics.median(mm_fresh), cold_r),
        ("  to the first call answered", statistics.median(mm_first), statistics.median(ref_first)),
    ):
        print(f"{label:<34}{mine * ms:>10.0f}ms{theirs * ms:>16.0f}ms{mine / theirs:>9.2f}")
    ref_p50, ref_p99 = _pct(ref_calls, 0.5), _pct(ref_calls, 0.99)
    for name, values in (("route_model", routed), ("validate_configs", validate)):
        p50, p99 = _pct(values, 0.5), _pct(values, 0.99)
        print(f"{name + ' p50':<34}{p50 * ms:>10.2f}ms{ref_p50 * ms:>16.2f}ms{p50 / ref_p50:>9.2f}")
        print(f"{name + ' p99':<34}{p99 * ms:>10.2f}ms{ref_p99 * ms:>16.2f}ms{p99 / ref_p99:>9.2f}")
    print(f"(calls per tool: {calls}; cold starts: {starts}; reference tool: get_current_time)")
    targets = (
        ("cold start", cold_m / cold_r, 1.2),
        ("route_model p50", _pct(routed, 0.5) / ref_p50, 1.3),
        ("validate_configs p50", _pct(validate, 0.5) / ref_p50, 3.0),
    )
    print(
        "targets: "
        + "; ".join(
            f"{name} <= {goal}x {'met' if ratio <= goal else 'NOT met'}" for name, ratio, goal in targets
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--starts", type=int, default=5)
    a = parser.parse_args()
    anyio.run(main, a.calls, a.starts)
