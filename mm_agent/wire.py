"""Replies to stdio lines the SDK cannot read as JSON-RPC messages.

The SDK's stdio transport hands such a line to the server as an exception, which the server drops, so
the client waits forever: bad JSON, or JSON nested deeper than the parser's limit (pydantic-core stops
at 200 levels). JSON-RPC 2.0 says such a request gets an error response: a parse error (-32700) for text
that cannot be parsed, an invalid request (-32600) for JSON that is not a message. The request's id is
recovered from the raw line when it can be (a top-level "id" key), else null. And what goes out is made
writable first: a lone surrogate anywhere in a message (a non-UTF-8 file name) is escaped, never left to
kill the SDK's writer.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError

from mm_agent.names import shown_data

_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _value_at(text: str, i: int) -> tuple[Any, int]:
    return _DECODER.raw_decode(text, i)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def top_level_id(text: str) -> str | int | None:
    """The value of the top-level "id" key of a JSON object in `text`, without parsing the rest: one pass
    that tracks nesting and skips strings (so it stays linear and cannot recurse, whatever the depth)."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            try:
                key, end = _value_at(text, i)
            except ValueError:
                return None
            if depth == 1:
                colon = _skip_ws(text, end)
                if key == "id" and colon < n and text[colon] == ":":
                    start = _skip_ws(text, colon + 1)
                    if start < n and (text[start] == '"' or text[start] in "-0123456789"):
                        try:
                            value, _ = _value_at(text, start)
                        except ValueError:
                            return None
                        ok = isinstance(value, str) or (
                            isinstance(value, int) and not isinstance(value, bool)
                        )
                        return value if ok else None
                    return None
            i = end
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        i += 1
    return None


def _request_id(errors: list[Any]) -> str | int | None:
    """The request's id, from the inputs pydantic reports: the raw line (bad JSON) or the parsed object
    (JSON that is not a message)."""
    for err in errors:
        raw = err.get("input")
        if isinstance(raw, str):
            return top_level_id(raw)
        if isinstance(raw, dict):
            rid = raw.get("id")
            if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
                return rid
    return None


def error_for(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error answering an unreadable line (`exc` as the SDK's stdio reader raised it)."""
    code, message = INVALID_REQUEST, f"not a JSON-RPC message: {exc}"
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        if err.get("type") == "json_invalid":
            reason = str(err.get("ctx", {}).get("error", err.get("msg", "")))
            code = PARSE_ERROR
            if "recursion limit" in reason:
                message = (
                    "the request is nested more than 200 levels deep, the JSON parser's limit; "
                    "send the arguments as flatter JSON"
                )
            else:
                message = f"the line is not valid JSON ({reason}); send one JSON-RPC message per line"
        else:
            message = (
                f"not a JSON-RPC 2.0 message: {err.get('msg')} at {'.'.join(map(str, err.get('loc', ())))}"
            )
    rid = _request_id(exc.errors() if isinstance(exc, ValidationError) else [])
    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=code, message=message))


def writable(item: SessionMessage) -> SessionMessage:
    """`item` as it can be written: any string in it that holds a lone surrogate (a file name that is not
    UTF-8, however it got there) escaped by `names.shown`. The SDK's writer would raise "surrogates not
    allowed" on it and the server would stop answering for good, so this is the last line of defence for
    every reply, notification and error, whatever tool, resource or prompt produced it."""
    message = shown_data(item.message)
    return item if message is item.message else SessionMessage(message, metadata=item.metadata)


class _WritableStream:
    """The transport's write stream, passing every message through `writable` first."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(writable(item))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WritableStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return bool(await self._inner.__aexit__(*exc))


async def serve_readable(server: Any, read_stream: Any, write_stream: Any) -> None:
    """Run a low-level MCP server over the transport streams, answering each unreadable line itself; every
    message out is made writable first (`writable`)."""
    write_stream = _WritableStream(write_stream)
    send, receive = create_context_streams[SessionMessage | Exception](0)

    async def forward() -> None:
        async with send:
            async for item in read_stream:
                if isinstance(item, Exception):
                    await write_stream.send(SessionMessage(error_for(item)))
                else:
                    await send.send(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(forward)
        await server.run(receive, write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()  # the server stopped reading: stop forwarding too
