"""The default text of `tail_logs` and `diagnose_errors`, read as a host that passes only the text would.

Why: some MCP hosts hand an assistant the text content alone. `tail_logs` used to answer "16 line(s) of
<log>, in `lines`", which such an assistant cannot read; `diagnose_errors` said the category twice
("(disk_full, disk_full)"). Both are called over a real in-process MCP client on a real run's log.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client

from mm_agent.server import build_server

LOG = [
    "starting the stand-in worker",
    "step 1 of 2 done",
    "OSError: [Errno 28] No space left on device: '/data/ckpt/iter_0000002/mp_rank_00/model_optim_rng.pt'",
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _text(result: object) -> str:
    return "\n".join(getattr(c, "text", "") or "" for c in getattr(result, "content", []))


@pytest.mark.anyio
async def test_tail_logs_text_carries_the_lines_and_diagnosis_names_the_category_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mm_agent.runs import RunStatusRequest, start_run, wait_run

    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    code = "import sys\nfor line in sys.argv[1:]: print(line)\nsys.exit(1)"
    info = start_run(
        "test", [sys.executable, "-c", code, *LOG], RunStatusRequest(run_id="x"), workspace=workspace
    )
    wait_run(info.run_id, lambda status: None)
    async with Client(build_server(workspace), raise_exceptions=True) as client:
        tail = _text(await client.call_tool("tail_logs", {"run_id": info.run_id}))
        for line in LOG:
            assert line in tail, tail
        assert "`lines`" not in tail
        diagnosis = _text(await client.call_tool("diagnose_errors", {"run_id": info.run_id}))
    head = diagnosis.splitlines()[0]
    assert head.startswith("Root cause: ") and head.endswith("(disk_full)."), head
    assert head.count("disk_full") == 1, head
