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
    p.add_argument(
        "--auth-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --transport http: clients must send `Authorization: Bearer <the token in FILE>` (one line, "
        "16+ characters, file mode 600); default: $MM_AGENT_HTTP_TOKEN; without either, HTTP is "
        "unauthenticated on loopback (a warning is logged)",
    )
    p.add_argument(
        "--trust-mm-root",
        dest="trust_mm_root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder holding MindSpeed-MM checkouts (and their Megatron-LM/MindSpeed) whose Python "
        "validate_configs(mm_root=...) may run to judge launches with MindSpeed-MM's own parser; repeatable. "
        "Without it the server runs no checkout's code: mm_root gets a dry run saying what would run",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mm_agent.errors import MMAgentError
    from mm_agent.httpauth import load_token
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
    trusted = [Path(t).expanduser() for t in args.trust_mm_root]
    for folder in trusted:
        if not folder.is_dir():
            raise MMAgentError(
                f"trusted checkout folder {folder} is not a directory",
                field="--trust-mm-root",
                fix="pass the MindSpeed-MM checkout (or the folder holding it and its Megatron-LM/MindSpeed)",
            )
    if args.auth_token_file is not None and args.transport != "http":
        raise MMAgentError(
            "--auth-token-file applies to --transport http only (stdio is the client's own pipe)",
            field="--auth-token-file",
            fix="add --transport http, or drop --auth-token-file",
        )
    token = load_token(args.auth_token_file, os.environ)[0] if args.transport == "http" else None
    transport = "stdio" if args.transport == "stdio" else "streamable-http"
    serve(
        workspace,
        transport,
        args.host,
        args.port,
        allow_roots=allowed,
        tool_timeout_s=timeout,
        trust_mm_roots=trusted,
        auth_token=token,
    )
    return 0
