"""What several security tests share: the render fields that are paths, the MCP handshake, a guarded child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Every RenderRequest field that names a file or folder (issue 12: none of them was confined, all reach scripts).
PATH_FIELDS = (
    "mm_root",
    "weights_dir",
    "load_path",
    "dataset_dir",
    "dataset_file",
    "save_path",
    "feature_dir",
)


def handshake(client: str) -> list[str]:
    """The two lines a stdio client sends before any call: initialize, then the initialized notification."""
    return [
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": client, "version": "1"},
                },
            }
        ),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ]


def run_python(code: str, timeout_s: float, what: str) -> str:
    """Run `code` in a fresh interpreter at the repo root; a hang fails the test (not the suite) naming `what`."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish within {timeout_s} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
