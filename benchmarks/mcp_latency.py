"""MCP latency of mm-agent, side by side with the reference server `mcp-server-time`, same client, same run.

Measures, over real stdio subprocesses:
  * cold start: spawn -> `initialize` answered -> `tools/list` answered (median of --starts runs, mm-agent's
    and the reference's alternating, so a busy machine slows both);
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


async def cold_start(params: StdioServerParameters) -> float:
    start = time.perf_counter()
    async with Client(params) as client:
        await client.list_tools()
        return time.perf_counter() - start


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
        for _ in range(starts):  # alternating: both see the same load
            mm_cold.append(await cold_start(mm))
            ref_cold.append(await cold_start(ref))
        timed, ref_calls = await interleaved(
            mm,
            ref,
            [
                ("route_model", {"request": "fine-tune Wan2.1 text-to-video on 8 NPUs"}),
                ("validate_configs", {"paths": ["job"]}),
            ],
            calls,
        )
        route, validate = timed["route_model"], timed["validate_configs"]

    ms = 1000.0
    print(f"{'measure':<34}{'mm-agent':>12}{'mcp-server-time':>18}{'ratio':>9}")
    cold_m, cold_r = statistics.median(mm_cold), statistics.median(ref_cold)
    print(
        f"{'cold start to tools/list (median)':<34}{cold_m * ms:>10.0f}ms{cold_r * ms:>16.0f}ms{cold_m / cold_r:>9.2f}"
    )
    ref_p50, ref_p99 = _pct(ref_calls, 0.5), _pct(ref_calls, 0.99)
    for name, values in (("route_model", route), ("validate_configs", validate)):
        p50, p99 = _pct(values, 0.5), _pct(values, 0.99)
        print(f"{name + ' p50':<34}{p50 * ms:>10.2f}ms{ref_p50 * ms:>16.2f}ms{p50 / ref_p50:>9.2f}")
        print(f"{name + ' p99':<34}{p99 * ms:>10.2f}ms{ref_p99 * ms:>16.2f}ms{p99 / ref_p99:>9.2f}")
    print(f"(calls per tool: {calls}; cold starts: {starts}; reference tool: get_current_time)")
    targets = (
        ("cold start", cold_m / cold_r, 1.2),
        ("route_model p50", _pct(route, 0.5) / ref_p50, 1.3),
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
