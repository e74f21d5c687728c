"""One MCP tool call over a real in-process client, as an assistant's host makes it: (the text, the structured
content, whether it is an error). Shared by the tests that check what a single call answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import Client

from mm_agent.server import build_server


async def call_tool(ws: Path, tool: str, **args: Any) -> tuple[str, dict[str, Any], bool]:
    async with Client(build_server(ws)) as client:
        result = await client.call_tool(tool, args)
    text = "\n".join(getattr(c, "text", "") or "" for c in result.content)
    return text, result.structured_content or {}, bool(result.is_error)
