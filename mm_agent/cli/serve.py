"""`mm-agent serve`: run the MCP server (stdio by default)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the MCP server (stdio for Claude Code and other MCP hosts)",
        epilog="example: claude mcp add mm-agent -- mm-agent serve --workspace /data/jobs",
    )
    p.add_argument(
        "--workspace",
        default=os.environ.get("MM_AGENT_WORKSPACE", "."),
        help="root every tool path is confined to (default: $MM_AGENT_WORKSPACE or the current directory)",
    )
    p.add_argument(
        "--allow-path",
        "--allow-root",
        dest="allow_path",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory outside the workspace that tool paths may also name, for data and weights mounted "
        "elsewhere; repeatable (--allow-root is the older name)",
    )
    p.add_argument(
        "--tool-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a tool call may take before it is answered with an error (default 300)",
    )
    p.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio (default, for MCP hosts that start the server) or http (streamable HTTP on --host:--port)",
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (loopback only)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mm_agent.errors import MMAgentError
    from mm_agent.server import TOOL_TIMEOUT_S, serve

    workspace = Path(args.workspace)
    if not workspace.is_dir():
        raise MMAgentError(
            f"workspace {workspace} is not a directory", field="--workspace", fix="create it first"
        )
    allowed = [Path(a).expanduser() for a in args.allow_path]
    for extra in allowed:
        if not extra.is_dir():
            raise MMAgentError(
                f"allowed path {extra} is not a directory",
                field="--allow-path",
                fix="create it (or mount it) first, or pass the directory that holds the data",
            )
    timeout = TOOL_TIMEOUT_S if args.tool_timeout is None else args.tool_timeout
    if not timeout > 0:
        raise MMAgentError(
            f"--tool-timeout {args.tool_timeout:g} is not positive",
            field="--tool-timeout",
            fix="pass seconds > 0",
        )
    transport = "stdio" if args.transport == "stdio" else "streamable-http"
    serve(workspace, transport, args.host, args.port, allow_roots=allowed, tool_timeout_s=timeout)
    return 0
