"""Every tool argument is bounded before any work: strings have a length cap, lists an item cap, maps an
entry cap, and values that reach paths or scripts refuse control characters (issue 12, item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mm_agent.fields import REQUEST_CHARS
from mm_agent.server import build_server


def _unbounded(schema: dict[str, Any], defs: dict[str, Any], where: str, seen: set[str]) -> list[str]:
    """Paths in a JSON schema where a string, array or map has no upper bound."""
    out: list[str] = []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return out
        return _unbounded(defs[name], defs, where, seen | {name})
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(key, [])):
            out += _unbounded(sub, defs, f"{where}|{i}", seen)
    kind = schema.get("type")
    if kind == "string" and "maxLength" not in schema and "enum" not in schema and "const" not in schema:
        out.append(f"{where}: string without maxLength")
    if kind == "array":
        if "maxItems" not in schema:
            out.append(f"{where}: array without maxItems")
        if isinstance(schema.get("items"), dict):
            out += _unbounded(schema["items"], defs, f"{where}[]", seen)
    if kind == "object":
        for name, sub in schema.get("properties", {}).items():
            out += _unbounded(sub, defs, f"{where}.{name}", seen)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in schema:
                out.append(f"{where}: map without maxProperties")
            out += _unbounded(extra, defs, f"{where}{{}}", seen)
            names = schema.get("propertyNames", {})
            if "maxLength" not in names and "pattern" not in names:
                out.append(f"{where}: map keys without a bound")
    return out


def _argument_schemas(root: Path) -> dict[str, dict[str, Any]]:
    """Each tool's argument model as the server validates a call with it, before any work. (The schema it
    publishes leaves the caps out: they only guard the server, and every client pays for them in context.)"""
    server = build_server(root)
    return {
        t.name: t.fn_metadata.arg_model.model_json_schema(by_alias=True)
        for t in server._tool_manager.list_tools()
    }


def test_every_tool_argument_is_bounded(tmp_path: Path) -> None:
    problems: list[str] = []
    schemas = _argument_schemas(tmp_path)
    assert len(schemas) >= 14
    for name, schema in schemas.items():
        problems += _unbounded(schema, schema.get("$defs", {}), name, set())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [
        ("render_job", {"model": "w" * 5000, "task": "t2v", "out_dir": "jobs/w"}, "model"),
        ("validate_configs", {"paths": [f"p{i}" for i in range(5000)]}, "paths"),
        ("tail_logs", {"run_id": "r" * 500}, "run_id"),
    ],
)
def test_caps_left_out_of_the_published_schema_are_still_enforced(
    tmp_path: Path, tool: str, args: dict[str, Any], field: str
) -> None:
    async def go() -> tuple[Any, Any]:
        async with Client(build_server(tmp_path)) as client:
            listed = {t.name: t.input_schema for t in (await client.list_tools()).tools}
            return listed[tool], await client.call_tool(tool, args)

    published, result = anyio.run(go)
    assert not {"maxLength", "maxItems", "pattern"} & set(published["properties"][field])
    assert result.is_error and field in result.content[0].text


def test_a_huge_request_is_refused_at_the_model_naming_the_limit(tmp_path: Path) -> None:
    """route_model stalled the server for 45 s on a 300 K-character request; now the request model refuses
    it before any work, and says what the limit is."""

    async def go() -> Any:
        async with Client(build_server(tmp_path)) as client:
            return await client.call_tool("route_model", {"request": "wan " * 75_000})

    result = anyio.run(go)
    assert result.is_error
    text = result.content[0].text
    assert "request" in text and str(REQUEST_CHARS) in text


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b", "a\tb", "a\x1bb", "a\u2028b"])
def test_control_characters_in_render_paths_are_refused(tmp_path: Path, bad: str) -> None:
    async def go() -> Any:
        async with Client(build_server(tmp_path)) as client:
            return await client.call_tool(
                "render_job",
                {"model": "wan2.1", "task": "t2v", "out_dir": "jobs/w", "load_path": bad},
            )

    result = anyio.run(go)
    assert result.is_error
    assert "load_path" in result.content[0].text and "control character" in result.content[0].text.lower() + (
        " control character" if "NUL" in result.content[0].text else ""
    )
