"""What an assistant reads: every default answer of the two setup workflows fits the 4,000-character budget,
the text is a short summary (not the model as JSON), and `detail=true` gives the whole model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mm_agent.answers import condense
from mm_agent.server import build_server

ANSWER_BUDGET = 4_000  # characters: text content + structured content as compact JSON

WORKFLOWS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "wan": [
        ("check_environment", {}),
        ("route_model", {"request": "fine-tune Wan2.1 on my videos"}),
        ("install_deps", {"model": "wan2.1"}),
        ("render_job", {"model": "wan2.1", "task": "t2v", "size": "1.3b", "out_dir": "jobs/wan"}),
        (
            "render_job",
            {"model": "wan2.1", "task": "t2v", "size": "1.3b", "out_dir": "jobs/wan", "confirm": True},
        ),
        ("validate_configs", {"paths": ["jobs/wan"]}),
        ("list_models", {}),
    ],
    "qwen": [
        ("route_model", {"request": "fine-tune Qwen2.5-VL-7B on 2 nodes with 8 NPUs each"}),
        ("install_deps", {"model": "qwen2.5vl"}),
        ("render_job", {"model": "qwen2.5vl", "task": "sft", "size": "7b", "nnodes": 2, "out_dir": "jobs/q"}),
        (
            "render_job",
            {
                "model": "qwen2.5vl",
                "task": "sft",
                "size": "7b",
                "nnodes": 2,
                "out_dir": "jobs/q",
                "confirm": True,
            },
        ),
        ("validate_configs", {"paths": ["jobs/q"]}),
        (
            "diagnose_errors",
            {"text": "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error."},
        ),
    ],
}


def _cost(result: Any) -> int:
    text = sum(len(getattr(c, "text", "") or "") for c in result.content)
    data = result.structured_content
    return text + (len(json.dumps(data, separators=(",", ":"), ensure_ascii=False)) if data else 0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("workflow", sorted(WORKFLOWS))
async def test_default_answers_fit_the_budget(tmp_path: Path, workflow: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with Client(build_server(ws)) as client:
        for tool, args in WORKFLOWS[workflow]:
            result = await client.call_tool(tool, args)
            assert not result.is_error, f"{tool}: {result.content}"
            text = result.content[0].text  # type: ignore[union-attr]
            assert not text.lstrip().startswith("{"), f"{tool}: the text is a summary, not the model as JSON"
            assert _cost(result) <= ANSWER_BUDGET, f"{tool} {args}: {_cost(result)} characters"


@pytest.mark.anyio
async def test_detail_gives_the_whole_model(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    args = {"model": "wan2.1", "task": "t2v", "out_dir": "jobs/wan"}
    async with Client(build_server(ws)) as client:
        brief = await client.call_tool("render_job", args)
        full = await client.call_tool("render_job", {**args, "detail": True})
        routed = await client.call_tool("route_model", {"request": "fine-tune Wan2.1 t2v", "detail": True})
    assert _cost(full) > _cost(brief)
    files = full.structured_content["files"]  # type: ignore[index]
    assert all(f["content"] for f in files) and "backup_dir" in full.structured_content  # type: ignore[operator]
    assert all(isinstance(f, str) for f in brief.structured_content["files"])  # type: ignore[index]  (names)
    cands = routed.structured_content["candidates"]  # type: ignore[index]
    assert len(cands) > 1 and all(c["pipeline"] for c in cands), "detail: every candidate's pipeline"


def test_condense_keeps_the_first_and_last_iteration_line_of_a_run() -> None:
    lines = ["start"] + [f" iteration {i:8d}/     100 | loss: 1.0" for i in range(1, 51)] + ["saved", "end"]
    out = condense(lines)
    assert out[0] == "start" and out[-2:] == ["saved", "end"]
    assert out[1].strip().startswith("iteration        1/") and out[3].strip().startswith(
        "iteration       50/"
    )
    assert out[2] == "... 48 iteration lines ..."
    assert condense(lines[:3]) == lines[:3]  # two iteration lines stay as they are


def test_condense_keeps_a_tracebacks_last_frame_and_exception() -> None:
    frames = [x for k in range(5) for x in (f'  File "m{k}.py", line {k}, in f{k}', f"    call{k}()")]
    whole = ["start", "Traceback (most recent call last):", *frames, "ValueError: boom", "end"]
    assert condense(whole) == [
        "start",
        "Traceback (most recent call last):",
        "  ... 4 frame(s) ...",
        '  File "m4.py", line 4, in f4',
        "    call4()",
        "ValueError: boom",
        "end",
    ]
    # a tail that starts inside a traceback (its head was cut off): the partial frames are summed up too
    cut = ["    result = agent.run()", "             ^^^^", *frames[:4], "KeyError: 'x'"]
    assert condense(cut) == [
        "  ... 2 frame(s) ...",
        '  File "m1.py", line 1, in f1',
        "    call1()",
        "KeyError: 'x'",
    ]
    assert condense(["  just indented", "text"]) == ["  just indented", "text"]  # no frames: kept as it is


@pytest.mark.anyio
async def test_a_rehearsal_route_says_the_demo_first_and_others_do_not(tmp_path: Path) -> None:
    """Asked to try Qwen2.5-VL on this machine first, the answer's next step is the VLM demo; a request for
    NPUs keeps install_deps next and carries neither `demo` nor `rehearse`."""
    ws = tmp_path / "ws"
    ws.mkdir()
    async with Client(build_server(ws)) as client:
        vlm = await client.call_tool("route_model", {"request": "先在本机试跑Qwen2.5-VL微调，没有NPU"})
        wan = await client.call_tool("route_model", {"request": "rehearse Wan2.1 text-to-video without NPUs"})
        npus = await client.call_tool("route_model", {"request": "fine-tune Qwen2.5-VL-7B on 16 NPUs"})
    for result, demo in ((vlm, "mm-agent demo --vlm"), (wan, "mm-agent demo")):
        text = result.content[0].text  # type: ignore[union-attr]
        assert f"Next: rehearse it here with `{demo}` (CLI)" in text, text
        data = result.structured_content
        assert data["parsed"]["rehearse"] is True and data["candidates"][0]["demo"] == demo  # type: ignore[index]
        assert _cost(result) <= ANSWER_BUDGET
    text = npus.content[0].text  # type: ignore[union-attr]
    assert "Next: install_deps model=qwen2.5vl" in text and "mm-agent demo" not in text
    assert "rehearse" not in npus.structured_content["parsed"]  # type: ignore[index]
    assert "demo" not in npus.structured_content["candidates"][0]  # type: ignore[index]
