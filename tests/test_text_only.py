"""Text-only hosts: some MCP hosts pass an assistant only the `content` text of a tool answer, never its
structured content. For each workflow of `benchmarks/context_cost.py` (the same calls, in the same order, over
a real in-process MCP client) the assistant here reads ONLY the text: the run id it polls is parsed from the
text, and each answer's text must carry what the next call takes (the model/task/size render_job takes, the
job directory validate_configs takes, the run id, the failing check's fix, whole fix commands) and never point
at structured fields ("see plan.conflicts", "in `lines`") a text-only host cannot see. The structured content
is read only to check that what the text says is the truth. The workflows' context cost (text + structured,
the workspace's temporary folder counted as a fixed name) stays at or below what it was when this test was
written, so the text carrying more does not make an assistant read more."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mm_agent.server import build_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# the workflows measured there are the ones checked here
from benchmarks import context_cost

# Characters of every call of a workflow (tools/list not included), the temporary folder counted as "<tmp>":
# the figures of commit ca6dc56, before the text answers were made to carry the next step.
CEILING = {"wan": 16_239, "qwen": 12_164, "crash": 5_800}

RUN_ID = re.compile(r"\brun ((?:extract|train|convert|infer|evaluate)-\d{8}-\d{6}-[0-9a-f]{6})\b")
STATE = re.compile(r"\): (starting|running|succeeded|failed|stopped|finished|done|exited)\b")
# phrases that send the reader to structured content: nothing a text-only host can follow
POINTS_AT_DATA = re.compile(
    r"see plan\.|in `lines`|see `lines`|by_rule|in the data|listed with summaries|listed by title"
)


@dataclass
class Answer:
    tool: str
    args: dict[str, Any]
    text: str
    data: dict[str, Any]
    error: bool


class TextReader(context_cost.Driver):
    """context_cost's driver, but what it hands the workflow back is read from the text alone."""

    def __init__(self, client: Client, schemas: dict[str, dict[str, Any]], tmp: Path) -> None:
        super().__init__(client, schemas, context_cost.Session())
        self.tmp = str(tmp)
        self.answers: list[Answer] = []

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, self._args(tool, args))
        text = "\n".join(getattr(c, "text", "") or "" for c in result.content)
        self.session.calls.append(context_cost.Cost(tool, 0, 0, bool(result.is_error)))
        self.answers.append(Answer(tool, args, text, result.structured_content or {}, bool(result.is_error)))
        read: dict[str, Any] = {}
        if m := RUN_ID.search(text):
            read["run_id"] = m.group(1)
        if tool == "job_status" and (m := STATE.search(text)):
            read["state"] = m.group(1)
        return read

    def costs(self) -> list[tuple[str, int, int]]:
        """(tool, text, structured) per answer read, for a failure message that says where the characters went."""
        return [
            (
                a.tool,
                len(a.text),
                len(json.dumps(a.data, separators=(",", ":"), ensure_ascii=False)) if a.data else 0,
            )
            for a in self.answers
        ]

    def cost(self) -> int:
        """What the assistant read: each answer's text and compact structured content, of job_status's polls
        the last one only (as context_cost counts), the temporary folder as one fixed name."""
        polls = [a for a in self.answers if a.tool == "job_status"]
        read = [a for a in self.answers if a.tool != "job_status"] + polls[-1:]
        shown = [
            a.text + (json.dumps(a.data, separators=(",", ":"), ensure_ascii=False) if a.data else "")
            for a in read
        ]
        return sum(len(s.replace(self.tmp, "<tmp>")) for s in shown)


async def _run(name: str, tmp: Path) -> TextReader:
    ws = tmp / "ws"
    async with Client(build_server(ws)) as client:
        tools = await client.list_tools()
        reader = TextReader(client, {t.name: t.input_schema for t in tools.tools}, tmp)
        await context_cost.WORKFLOWS[name](reader, ws)
    polls = [a for a in reader.answers if a.tool == "job_status"]
    reader.answers = [a for a in reader.answers if a.tool != "job_status"] + polls[-1:]
    return reader


def _find(reader: TextReader, tool: str, **args: Any) -> Answer:
    return next(
        a for a in reader.answers if a.tool == tool and all(a.args.get(k) == v for k, v in args.items())
    )


def _check_every_answer(reader: TextReader) -> None:
    for a in reader.answers:
        assert a.text.strip(), f"{a.tool}: no text"
        bad = POINTS_AT_DATA.search(a.text)
        assert bad is None, f"{a.tool}: the text sends a text-only reader to structured content: {a.text!r}"
        if a.error:
            assert re.search(r"\bfix: \S", a.text, re.I), f"{a.tool}: an error without its fix: {a.text!r}"


def _best_route(reader: TextReader) -> tuple[Answer, dict[str, Any]]:
    """route_model's answer and its best candidate, which the text names (model, task, size)."""
    route = _find(reader, "route_model")
    best = route.data["candidates"][0]
    assert f"Best: {best['model_id']} {best['task']} " in route.text and f"size {best['size']}" in route.text
    return route, best


def _check_validate(a: Answer) -> None:
    assert re.match(r"(ok|NOT ok): ", a.text), a.text
    for line in a.text.splitlines():
        if (
            line.startswith("- ") and " Fix: " in line
        ):  # an error: its fix whole (a cut command cannot be run)
            assert not line.endswith("…"), f"validate_configs: a fix cut short: {line!r}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_wan_text_alone_leads_to_the_next_call(ws: Path) -> None:
    reader = await _run("wan", ws.parent)
    _check_every_answer(reader)
    env = _find(reader, "check_environment")
    if any(c["status"] == "fail" for c in env.data.get("checks", [])):  # the first failure's fix, in the text
        assert re.search(r"\nFirst: .+\nFix: \S", env.text), env.text
    route, best = _best_route(reader)
    assert f"install_deps model={best['model_id']}" in route.text and "render_job" in route.text
    install = _find(reader, "install_deps")
    assert "confirm=true" in install.text
    for conflict in install.data.get("plan", {}).get("conflicts", []):
        assert str(conflict.get("package", conflict)) in install.text, install.text
    assert "confirm=true" in _find(reader, "render_job", confirm=None).text
    assert "jobs/wan" in _find(reader, "render_job", confirm=True).text  # validate_configs' path
    _check_validate(_find(reader, "validate_configs"))
    assert reader.cost() <= CEILING["wan"], reader.costs()


@pytest.mark.anyio
async def test_qwen_text_alone_leads_to_the_next_call(ws: Path) -> None:
    reader = await _run("qwen", ws.parent)
    _check_every_answer(reader)
    route, _ = _best_route(reader)
    assert "launcher=pdsh" in route.text  # a 2-node job: render_job's launcher argument
    assert "jobs/qwen" in _find(reader, "render_job", confirm=True).text
    _check_validate(_find(reader, "validate_configs"))
    assert reader.cost() <= CEILING["qwen"], reader.costs()


@pytest.mark.anyio
async def test_crash_text_alone_leads_to_the_cause_and_fix(ws: Path) -> None:
    reader = await _run("crash", ws.parent)
    _check_every_answer(reader)
    started = _find(reader, "extract_features")
    assert RUN_ID.search(started.text) and RUN_ID.search(started.text).group(1) == started.data["run_id"]  # type: ignore[union-attr]
    status = _find(reader, "job_status")
    assert status.data["state"] == "failed" and "failed" in status.text
    if status.data.get("root_cause", {}).get("fixes"):
        assert "Fix: " in status.text, status.text
    tail = _find(reader, "tail_logs")
    # the log's lines are the text's (after its header line), said once: not repeated as data
    assert [line for line in tail.text.splitlines()[1:] if line.strip()] and "lines" not in tail.data, (
        f"tail_logs: the lines are not (only) in the text: {tail.text!r}"
    )
    diagnosis = _find(reader, "diagnose_errors")
    assert "Root cause: " in diagnosis.text and "Fix: " in diagnosis.text, diagnosis.text
    assert reader.cost() <= CEILING["crash"], reader.costs()
