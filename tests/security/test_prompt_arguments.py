"""`prompts/get` with argument names a prompt does not take (issue 25, low hole).

Hole guarded here: the SDK answered unknown argument names with a generic internal error (or dropped them),
so a client could not tell a misspelt argument from a server bug. Now they are an invalid-params error
(-32602) naming the unknown names and the arguments the prompt takes. Real in-process clients, both eras.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from mm_agent.server import build_server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_unknown_prompt_arguments_are_invalid_params_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    cases = [
        ("finetune_vlm", {"request": "x", "dataset_file": "d.jsonl", "datset": "y"}, ["datset"]),
        ("recover_failed_run", {"log_path": "logs", "run": "x", "zz": "1"}, ["run", "zz"]),
        ("finetune_generative", {"request": "x", "dataset_dir": "data", "weights": "w"}, ["weights"]),
    ]
    async with Client(build_server(tmp_path), mode=mode) as client:
        listed = {p.name: [a.name for a in p.arguments or []] for p in (await client.list_prompts()).prompts}
        for name, args, unknown in cases:
            with pytest.raises(MCPError) as err:
                await client.get_prompt(name, args)
            assert err.value.code == INVALID_PARAMS, (name, err.value.code, err.value.message)
            message = err.value.message
            assert all(repr(u) in message for u in unknown), message
            assert all(a in message for a in listed[name]), message  # what the prompt does take
        ok = await client.get_prompt("recover_failed_run", {"log_path": "logs"})  # known names still work
        assert ok.messages
