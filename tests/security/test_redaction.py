"""Issue 25 (low): secrets in logs left mm-agent through its tools. `diagnose_errors` redacted nothing (an
`hf_...` token came back as evidence and in the finding's title), and `redact()` (tail_logs, job_status)
missed `AWS_SECRET_ACCESS_KEY=`, `ghp_...`/`github_pat_...`, `--password x`, `"api_key": "sk-..."` and
`HF_TOKEN: ...`.

A real run (a worker started by `runs.start_run`, as conversions are) prints a log holding each form, on
failure lines the catalog matches and on plain lines, and ends with a report whose message quotes one.
Every tool that reads it (diagnose_errors by path and by run id, tail_logs, job_status) is called through a
real in-process MCP client; no secret may be in any answer, text or structured, while the lines around the
secrets (what a diagnosis needs) are still there.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client
from pydantic import BaseModel

from mm_agent.diagnose import DiagnoseRequest, diagnose_errors
from mm_agent.jobs import job_status, tail_logs
from mm_agent.runs import LOG, RunStatusRequest, run_dir_for, run_status, start_run
from mm_agent.server import build_server

# (the secret value, the log line carrying it); the values are made up but shaped like the real ones
SECRETS = {
    "hf": ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "Incorrect path_or_model_id: '{}'"),
    "hf_plain": ("hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa76543210", "login with token {}"),
    "aws": ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "ModuleNotFoundError: No module named 'boto' AWS_SECRET_ACCESS_KEY={}"),
    "ghp": ("ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "ModuleNotFoundError: No module named 'git' GITHUB_AUTH {}"),
    "github_pat": ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", "remote: using {}"),
    "password": ("Tr0ub4dor&3-horse", "ModuleNotFoundError: No module named 'db' argv: train.py --password {} --lr 1e-5"),
    "api_key": ("sk-proj-4fJ9x2LmQp7RtY8wZk3NcV5bH1", 'ModuleNotFoundError: No module named \'openai\' {{"api_key": "{}"}}'),
    "hf_token_yaml": ("s3cr3t-Value-9f8e7d", "ModuleNotFoundError: No module named 'yaml' HF_TOKEN: {}"),
}  # fmt: skip
# lines with no secret, which must come back whole (a diagnosis needs them)
PLAIN = [
    "ModuleNotFoundError: No module named 'einops'",
    " iteration        3/      10 | consumed samples: 24 | lm loss: 1.2345E+00 | max_tokens=512",
    "tokenizer_name_or_path=/data/models/Qwen2.5-VL-7B-Instruct pad_token: <|endoftext|> --tokenizer-model /m",
]


def _log_text() -> str:
    lines = [template.format(value) for value, template in SECRETS.values()]
    return "\n".join([*PLAIN, *lines, *PLAIN]) + "\n"


def _worker(run_dir_code: str) -> list[str]:
    """A worker printing the log, then writing a report whose message quotes a secret (as a failure that
    echoes its command line would)."""
    code = (
        "import json, sys, pathlib\n"
        f"sys.stdout.write({_log_text()!r})\n"
        "run = pathlib.Path(sys.argv[1])\n"
        f"report = {{'status': 'failed', 'message': {run_dir_code!r}, 'plan': {{}}}}\n"
        "(run / 'report.json').write_text(json.dumps(report))\n"
    )
    return [sys.executable, "-c", code]


class _Req(BaseModel):
    what: str = "redaction test"


def _finished_run(workspace: Path | None = None) -> str:
    message = (
        f"failed: mm-convert exited 1 (argv: --hf-token {SECRETS['hf'][0]} HF_TOKEN={SECRETS['hf_plain'][0]})"
    )
    info = start_run("conv", _worker(message), _Req(), workspace=workspace)  # (a server reads its own runs)
    deadline = time.monotonic() + 60
    while run_status(RunStatusRequest(run_id=info.run_id)).state == "running":
        assert time.monotonic() < deadline, "the worker did not finish"
        time.sleep(0.1)
    return info.run_id


def _leaks(blob: str) -> list[str]:
    return [name for name, (value, _) in SECRETS.items() if value in blob]


def _dump(obj: Any) -> str:
    return obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_core_answers_carry_no_secret(ws: Path) -> None:
    run_id = _finished_run()
    log = run_dir_for(run_id) / LOG
    assert _leaks(log.read_text(encoding="utf-8")) == list(SECRETS)  # the log itself holds them all
    shutil.copy(log, ws / "train.log")

    by_path = diagnose_errors(DiagnoseRequest(paths=["train.log"], max_evidence=20), root=ws)
    by_run = diagnose_errors(DiagnoseRequest(run_id=run_id, max_evidence=20))
    tail = tail_logs(run_id, 100)
    status = job_status(run_id, 100)
    for name, answer in (
        ("diagnose by path", by_path),
        ("diagnose by run", by_run),
        ("tail", tail),
        ("status", status),
    ):
        assert _leaks(_dump(answer)) == [], f"{name} leaks"

    # what is not a secret stays: the evidence lines, the plain log lines, the report's words
    evidence = [e.text for f in by_path.findings for e in f.evidence]
    assert "ModuleNotFoundError: No module named 'einops'" in evidence
    assert any(
        t.startswith("ModuleNotFoundError: No module named 'boto' AWS_SECRET_ACCESS_KEY=") for t in evidence
    )
    assert all(line in tail.lines for line in PLAIN)
    assert all(line in status.log_tail for line in PLAIN)
    assert "mm-convert exited 1" in status.message
    assert "--hf-token" in status.message and "HF_TOKEN=" in status.message


@pytest.mark.anyio
async def test_mcp_answers_carry_no_secret(ws: Path) -> None:
    run_id = _finished_run(ws)
    shutil.copy(run_dir_for(run_id) / LOG, ws / "train.log")
    calls = [
        ("diagnose_errors", {"paths": ["train.log"], "max_evidence": 20, "detail": True}),
        ("diagnose_errors", {"paths": ["train.log"]}),
        ("diagnose_errors", {"run_id": run_id, "detail": True}),
        ("diagnose_errors", {"text": _log_text(), "detail": True}),
        ("tail_logs", {"run_id": run_id, "lines": 100}),
        ("tail_logs", {"run_id": run_id, "lines": 100, "detail": True}),
        ("job_status", {"run_id": run_id, "log_lines": 100, "detail": True}),
        ("job_status", {"run_id": run_id}),
    ]
    async with Client(build_server(ws), raise_exceptions=True) as client:
        for tool, args in calls:
            answer = await client.call_tool(tool, args)
            assert not answer.is_error, answer.content
            text = "".join(getattr(c, "text", "") for c in answer.content)
            blob = text + json.dumps(answer.structured_content)
            assert _leaks(blob) == [], f"{tool} {args} leaks"
            if tool == "tail_logs":
                assert PLAIN[2] in blob  # the non-secret lines stay whole


def test_rules_are_data_checked_at_load(tmp_path: Path) -> None:
    """The shipped table loads (every example checked); a rule that fails its own example, or masks a line
    listed to keep, is refused naming the file and the schema, like every other data file."""
    from mm_agent.errors import MMAgentError
    from mm_agent.redact import SECRETS_FILE, load_secret_rules, redact_data

    assert {r.id for r in load_secret_rules().rules} >= {"hf_token", "github_token", "flag", "named"}
    raw = yaml.safe_load(SECRETS_FILE.read_text(encoding="utf-8"))
    named = next(r for r in raw["rules"] if r["id"] == "named")
    for broken in (
        {**named, "regex": named["regex"].replace("(?P<secret>", "(?P<value>")},  # no `secret` group
        {**named, "keeps": ["HF_TOKEN=abc"]},  # a secret listed as a line to keep
        {**named, "masks": [{"line": "plain abc words", "secret": "abc"}]},  # an example it does not mask
    ):
        path = tmp_path / "secrets.yaml"
        path.write_text(yaml.safe_dump({"rules": [broken]}), encoding="utf-8")
        with pytest.raises(MMAgentError) as refused:
            load_secret_rules(path)
        assert refused.value.file == str(path) and "mm_agent/redact.py" in (refused.value.fix or "")

    # structured data: a value under a key that names a secret is masked whole, other values stay
    data = {"env": {"HF_TOKEN": "abc", "PATH": "/usr/bin"}, "argv": ["--token", "x"], "n": 3}
    assert redact_data(data) == {
        "env": {"HF_TOKEN": "***", "PATH": "/usr/bin"},
        "argv": ["--token", "x"],
        "n": 3,
    }
