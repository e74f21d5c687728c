""" "Add my own model" routes to the scaffold (issue 28, item 5): route_model, `mm-agent route --json` and the
MCP answer name `scaffold_model` / `mm-agent new-model NAME --from BASE` instead of a shipped model, in English
and Chinese; requests for a shipped model never do."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mm_agent.cli import build_parser, main
from mm_agent.route import RouteRequest, load_vocabulary, route_model
from mm_agent.server import build_server
from mm_agent.workspace import set_workspace

NEW_MODEL_REQUESTS = [
    "add my own model",
    "bring my own DiT",
    "I have my own architecture, how do I train it with MindSpeed-MM?",
    "develop a new model on MindSpeed-MM's FSDP2 backend",
    "我想加一个自己的模型",
    "自定义模型怎么接入MindSpeed-MM",
    "新模型开发",
    "我有自己的DiT结构，想在昇腾上训练",
]
SHIPPED_REQUESTS = [
    "fine-tune Wan2.1 text-to-video on my videos",
    "train a DiT video model on 8 NPUs",
    "把Qwen2.5-VL做多模态理解微调",
    "fine-tune the new Wan2.2 model",
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _registry_workspace() -> Iterator[None]:
    """`build_server` makes its workspace the registry's for the whole process: not beyond this file's tests."""
    yield
    set_workspace(None)


def both(capsys: pytest.CaptureFixture[str], text: str) -> dict[str, Any]:
    """The core result and `mm-agent route --json` for the same request; they must be equal."""
    core = route_model(RouteRequest(request=text)).model_dump(mode="json")
    assert main(["route", text, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == core
    return core


@pytest.mark.parametrize("text", NEW_MODEL_REQUESTS)
def test_a_request_to_add_a_model_routes_to_the_scaffold(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    r = both(capsys, text)
    assert r["parsed"]["new_model"], r["parsed"]
    new = r["new_model"]
    assert new is not None and new["tool"] == "scaffold_model"
    assert new["command"] == f"mm-agent new-model NAME --from {new['base']}", new
    assert new["base"] == load_vocabulary().new_model.base
    # a shipped model is not what was asked for: no candidate, no question among shipped models
    assert r["candidates"] == [] and r["question"] is None, (r["candidates"][:1], r["question"])


@pytest.mark.parametrize("text", SHIPPED_REQUESTS)
def test_a_request_for_a_shipped_model_does_not(capsys: pytest.CaptureFixture[str], text: str) -> None:
    r = both(capsys, text)
    assert not r["parsed"]["new_model"] and r["new_model"] is None
    assert r["candidates"] or r["question"]


def test_the_scaffold_command_and_demo_parse_with_the_real_parser() -> None:
    """What the route tells a person to type is a real `mm-agent` command line."""
    new = route_model(RouteRequest(request="add my own model")).new_model
    assert new is not None
    parser = build_parser()
    for command in (new.command, new.demo):
        args = parser.parse_args(shlex.split(command)[1:])
        assert callable(args.func), command
    args = parser.parse_args(shlex.split(new.command)[1:])
    assert (args.name, args.base) == ("NAME", new.base)


@pytest.mark.anyio
async def test_the_mcp_answer_names_the_tool_and_the_command(tmp_path: Path) -> None:
    async with Client(build_server(tmp_path), raise_exceptions=True) as client:
        r = await client.call_tool("route_model", {"request": "bring my own DiT"})
        plain = await client.call_tool("route_model", {"request": "fine-tune Wan2.1 t2v"})
    assert not r.is_error
    text = r.content[0].text  # type: ignore[union-attr]
    assert "scaffold_model" in text and "mm-agent new-model NAME --from " in text, text
    assert "mm-agent demo --new-model" in text, text
    assert r.structured_content is not None and r.structured_content["new_model"]["tool"] == "scaffold_model"
    # a plain route is not charged for the new field
    assert plain.structured_content is not None
    assert (
        "new_model" not in plain.structured_content and "new_model" not in plain.structured_content["parsed"]
    )


@pytest.mark.parametrize(
    ("text", "base"),
    [
        ("bring my own DiT based on Wan2.2", "wan2.2-5b"),
        ("add my own model starting from Wan2.1 14B", "wan2.1-14b"),
        ("我想基于Wan2.2 A14B开发一个新模型", "wan2.2-a14b"),
        ("add my own model like Qwen2.5-VL", "wan2.1"),  # not a DiT the scaffold starts from: the default
    ],
)
def test_the_scaffold_starts_from_the_dit_the_request_names(
    capsys: pytest.CaptureFixture[str], text: str, base: str
) -> None:
    from mm_agent.scaffold.spec import load_spec

    r = both(capsys, text)
    assert r["new_model"]["base"] == base, r["parsed"]
    assert load_spec().base(base) is not None  # a base scaffold_model takes


def test_the_skills_send_a_new_model_request_to_the_scaffold() -> None:
    """The router skill's table and rule, and the generative skill's `new-model` workflow: `scaffold_model`
    (dry run, then confirm), its CLI line, the bases the scaffold takes and the demo, from the data they come from."""
    from mm_agent.scaffold.spec import load_spec
    from mm_agent.skills.build import skills_dir

    router = (skills_dir() / "mindspeed-mm-pipeline" / "SKILL.md").read_text(encoding="utf-8")
    gen = (skills_dir() / "mindspeed-mm-generative" / "SKILL.md").read_text(encoding="utf-8")
    vocab = load_vocabulary().new_model
    assert "| `mindspeed-mm-generative` | `new-model` |" in router
    assert f"`mm-agent new-model NAME --from {vocab.base}`" in router and "`scaffold_model`" in router
    assert "**Workflow `new-model`" in gen and "**`scaffold_model`** (scaffold)" in gen
    assert "`mm-agent new-model {name} --from {base} --checkout {mm_root} --yes`" in gen
    assert all(f"`{b.id}`" in gen for b in load_spec().bases) and f"`{vocab.demo}`" in gen
    description = gen.split("---")[1]
    assert "自定义模型" in description and "自定义模型" in vocab.words  # a trigger word the router also reads
