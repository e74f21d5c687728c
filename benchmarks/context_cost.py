"""What an assistant reads: characters per MCP call and per workflow, this checkout against an earlier release.

Three workflows run through a real stdio client against `mm-agent serve`, each in a fresh workspace:
  wan     "fine-tune Wan2.1 on my videos": check_environment, route_model, install_deps (plan), render_job
          (dry run, then write), validate_configs, extract_features and launch_training (dry runs);
  qwen    "fine-tune Qwen2.5-VL-7B on 2x8 NPUs": route_model, install_deps, render_job (dry run, write),
          validate_configs, launch_training (dry run);
  crash   "my run crashed": a bundled Wan job whose extraction really fails (its dataset names a video that
          is not there), then job_status, tail_logs and diagnose_errors on that run's log.
A call's cost is what lands in the assistant's context: the text content plus the structured content as
compact JSON. `tools/list` (compact JSON) is counted once per session. The same workflows run against the
baseline (a git commit or tag, exported into a temporary folder and served from there), adapting to its
argument shape (a nested `req` object in early releases), and the ratios are printed side by side.

    python benchmarks/context_cost.py [--baseline 2e3ff11] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
ALIASES = {"request": "text"}  # argument names of earlier releases


@dataclass
class Cost:
    tool: str
    text: int
    structured: int
    error: bool

    @property
    def total(self) -> int:
        return self.text + self.structured


@dataclass
class Session:
    tools_list: int = 0
    calls: list[Cost] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.tools_list + sum(c.total for c in self.calls)


class Driver:
    """Calls tools with flat arguments, wrapped as `req` for servers whose tools take one object."""

    def __init__(self, client: Client, schemas: dict[str, dict[str, Any]], session: Session) -> None:
        self.client, self.schemas, self.session = client, schemas, session

    def _args(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        props = self.schemas[tool].get("properties", {})
        if set(props) == {"req"}:
            inner = self.schemas[tool].get("$defs", {})
            names = next(iter(inner.values()), {}).get("properties", {}) if inner else {}
            return {"req": {ALIASES.get(k, k) if k not in names else k: v for k, v in args.items()}}
        return {ALIASES.get(k, k) if k not in props else k: v for k, v in args.items()}

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, self._args(tool, args))
        text = sum(len(getattr(c, "text", "") or "") for c in result.content)
        data = result.structured_content
        structured = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False)) if data else 0
        self.session.calls.append(Cost(tool, text, structured, bool(result.is_error)))
        if data is None and result.content and not result.is_error:
            try:
                data = json.loads(getattr(result.content[0], "text", ""))
            except ValueError:
                data = {}
        return data or {}


def _bundled_dataset(ws: Path) -> None:
    (ws / "data").mkdir()
    (ws / "data" / "data.json").write_text(
        json.dumps([{"path": "clips/missing.mp4", "cap": "a cat on the grass"}]), encoding="utf-8"
    )


async def wan(d: Driver, ws: Path) -> None:
    await d.call("check_environment")
    await d.call("route_model", request="fine-tune Wan2.1 on my videos")
    await d.call("install_deps", model="wan2.1")
    job = {"model": "wan2.1", "task": "t2v", "size": "1.3b", "out_dir": "jobs/wan"}
    await d.call("render_job", **job)
    await d.call("render_job", **job, confirm=True)
    await d.call("validate_configs", paths=["jobs/wan"])
    await d.call("extract_features", job_dir="jobs/wan")
    await d.call("launch_training", job_dir="jobs/wan")


async def qwen(d: Driver, ws: Path) -> None:
    await d.call("route_model", request="fine-tune Qwen2.5-VL-7B on 2 nodes with 8 NPUs each")
    await d.call("install_deps", model="qwen2.5vl")
    job = {"model": "qwen2.5vl", "task": "sft", "size": "7b", "nnodes": 2, "npus_per_node": 8}
    await d.call("render_job", **job, out_dir="jobs/qwen")
    await d.call("render_job", **job, out_dir="jobs/qwen", confirm=True)
    await d.call("validate_configs", paths=["jobs/qwen"])
    await d.call("launch_training", job_dir="jobs/qwen")


async def crash(d: Driver, ws: Path) -> None:
    _bundled_dataset(ws)
    job = {
        "model": "wan2.1",
        "task": "t2v",
        "size": "1.3b",
        "runtime": "bundled",
        "device": "cpu",
        "npus_per_node": 1,
        "dataset_dir": "data",
        "dataset_file": "data/data.json",
        "out_dir": "jobs/crash",
        "confirm": True,
    }
    await d.call("render_job", **job)
    started = await d.call("extract_features", job_dir="jobs/crash", confirm=True)
    run_id = started.get("run_id")
    if not run_id:
        raise SystemExit(f"extract_features did not start: {started}")
    status: dict[str, Any] = {}
    for _ in range(240):  # the run fails within seconds (torch import + the missing clip)
        status = await d.call("job_status", run_id=run_id)
        d.session.calls.pop()  # polling is not what the assistant reads; the last answer is
        if status.get("state") not in ("running", "starting", None):
            break
        await anyio.sleep(0.5)
    await d.call("job_status", run_id=run_id)
    await d.call("tail_logs", run_id=run_id)
    if "run_id" in d.schemas["diagnose_errors"].get("properties", {}):
        await d.call("diagnose_errors", run_id=run_id)
    else:  # early releases read only workspace paths: the assistant copies the run's log in first
        log = Path(status["log"])
        (ws / "logs").mkdir(exist_ok=True)
        (ws / "logs" / log.name).write_bytes(log.read_bytes())
        await d.call("diagnose_errors", paths=[f"logs/{log.name}"])


WORKFLOWS: dict[str, Callable[[Driver, Path], Any]] = {"wan": wan, "qwen": qwen, "crash": crash}


async def run_workflow(source: Path, name: str) -> Session:
    session = Session()
    with tempfile.TemporaryDirectory(prefix="mm-ctx-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "mm_agent", "serve", "--workspace", str(ws)],
            cwd=str(source),
            env={**os.environ, "MM_AGENT_STATE_DIR": str(Path(tmp) / "state")},
        )
        async with Client(params) as client:
            tools = await client.list_tools()
            listed = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools.tools]
            session.tools_list = len(json.dumps(listed, separators=(",", ":"), ensure_ascii=False))
            schemas = {t.name: t.input_schema for t in tools.tools}
            await WORKFLOWS[name](Driver(client, schemas, session), ws)
    return session


def export(ref: str, into: Path) -> Path:
    """The tree of `ref` (mm_agent, templates, runtime) in `into`, served from there."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=None, help="git commit or tag to compare with (default: none)")
    ap.add_argument("--workflows", nargs="*", default=list(WORKFLOWS), choices=list(WORKFLOWS))
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mm-ctx-base-") as base_tmp:
        sources = {"this": ROOT}
        if args.baseline:
            sources[args.baseline] = export(args.baseline, Path(base_tmp))
        out: dict[str, dict[str, Any]] = {}
        for label, source in sources.items():
            for name in args.workflows:
                t0 = time.perf_counter()
                session = anyio.run(run_workflow, source, name)
                out.setdefault(name, {})[label] = {
                    "tools_list": session.tools_list,
                    "calls": [(c.tool, c.text, c.structured, c.error) for c in session.calls],
                    "total": session.total,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, by_label in out.items():
        print(f"\n== workflow {name}")
        for label, fig in by_label.items():
            print(
                f"  [{label}] tools/list {fig['tools_list']:,} chars; total {fig['total']:,} ({fig['seconds']} s)"
            )
            for tool, text, structured, error in fig["calls"]:
                flag = "  ERROR" if error else ""
                print(
                    f"    {tool:<18} text {text:>7,}  structured {structured:>7,}  = {text + structured:>7,}{flag}"
                )
        if args.baseline and len(by_label) == 2:
            this, base = by_label["this"]["total"], by_label[args.baseline]["total"]
            print(f"  ratio baseline/this: {base / max(this, 1):.1f}x fewer characters")


if __name__ == "__main__":
    main()
