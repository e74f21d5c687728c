"""A file whose name is not UTF-8 must never kill the server or the CLI (issue 25, high).

The hole: a clip named with the bytes \\xff\\xfe (as archives unzipped from Windows/GBK machines have)
plus its caption, then `prepare_dataset`: the reply carried the name as Python's lone-surrogate text, the
SDK's writer raised "surrogates not allowed" and the server died; every later call got EOF. The same with
`diagnose_errors` on a folder holding such a log, `validate_configs` / `check_environment(job=...)` on a job
holding such a script, and `resources/list` while such a file sits in a job; the CLI printed a traceback.

Here every tool the server lists is called with arguments that reach such names (and such bytes inside
files) over a real stdio server, plus resources and prompts: every call must be answered, every line the
server writes must be strict UTF-8 JSON with no lone surrogate, no tool error may be the SDK's bare
"Error executing tool" (an exception that escaped), and the server must still answer afterwards. The CLI
gets the same inputs (names also as raw argv bytes) and must never print a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from security.common import handshake
from security.nonutf8 import BAD, RawStdio, build_workspace, server_env, surrogates

DEADLINE_S = 120.0  # hang guard for the run to end: never reached when the code works
RUN = "{run}"  # stands for the run id the confirmed launch_training returns


def _calls() -> dict[str, list[dict[str, Any]]]:
    """Per tool, the arguments that make it read the non-UTF-8 names of `build_workspace`. Keyed by every
    tool the server lists (a new tool must be added here)."""
    wan = {"model": "wan2.1", "task": "t2v"}
    return {
        "list_models": [{}],
        "route_model": [{"request": "fine-tune wan2.1 t2v on the clips in ds_bad"}],
        "estimate_resources": [
            {"model": "wan2.1", "job_dir": "job_bad"},
            {"model": "wan2.1", "job_dir": "job_link"},
        ],
        "render_job": [
            {**wan, "out_dir": "ds_bad"},  # a folder that is no job, full of such names
            {
                **wan,
                "out_dir": "job_new",
                "weights_dir": "weights_bad",
                "dataset_dir": "ds_bad",
                "load_path": "weights_bad",
                "mm_root": "job_bad",
            },
            {**wan, "out_dir": "job_link"},
            {**wan, "out_dir": "job_force", "confirm": True, "force": True},  # outputs so named move
        ],
        "validate_configs": [
            {"paths": ["job_bad"]},
            {"paths": ["job_bad/gbk_paths.sh"]},
            {"paths": ["job_run", "ds_bad", "weights_bad"]},
            {"paths": ["job_link", "ds_link"]},
        ],
        "prepare_dataset": [
            {**wan, "dir": "ds_bad"},
            {**wan, "dir": "ds_bad", "index": "ds_bad/index.csv"},
            {**wan, "dir": "ds_bad", "job_dir": "job_run"},
            {**wan, "dir": "ds_link"},
            {**wan, "dir": "ds_link", "confirm": True},
            {**wan, "dir": "ds_bad", "confirm": True},
        ],
        "diagnose_errors": [
            {"paths": ["logs_bad"]},
            {"paths": ["job_run", "job_bad", "job_link"]},
            {"run_id": RUN},
        ],
        "check_environment": [
            {"job": "job_bad", "checks": ["crlf_scripts", "disk_space"]},
            {"job": "job_run"},
            {"job": "job_link", "checks": ["crlf_scripts", "disk_space", "runtime_deps"]},
            {"mm_root": "job_bad", "checks": ["mm_checkout"]},
        ],
        "install_deps": [{"model": "wan2.1", "mm_root": "job_bad", "src_dir": "ds_bad"}],
        "convert_weights": [
            {"converter": "WanConverter", "method": "hf_to_mm", "source": "weights_bad", "target": "w_mm"},
            {
                "converter": "WanConverter",
                "method": "hf_to_mm",
                "source": "weights_bad/transformer",
                "target": "w_mm",
            },
            {"converter": "WanConverter", "method": "hf_to_mm", "source": "w_link", "target": "w_mm"},
            {
                "converter": "WanConverter",
                "method": "mm_to_hf",
                "source": "job_bad",
                "target": "w_hf",
                "hf_dir": "weights_bad",
            },
        ],
        "extract_features": [{"job_dir": "job_bad"}, {"job_dir": "job_run"}, {"job_dir": "job_link"}],
        "launch_training": [
            {"job_dir": "job_bad"},
            {"job_dir": "job_run"},
            {"job_dir": "job_link"},
            {"job_dir": "job_link", "confirm": True},
        ],
        "job_status": [{"run_id": RUN}],
        "tail_logs": [{"run_id": RUN}],
        "stop_job": [{"run_id": RUN}],
        "scaffold_model": [
            {"name": "baddit", "checkout": "job_bad"},  # a folder full of such names, no checkout
            {"name": "baddit", "out": "ds_bad"},
            {"name": "baddit", "out": "job_link"},
            {"name": "baddit", "out": "new_bad", "confirm": True},
        ],
    }


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("nonutf8") / "ws"
    build_workspace(ws)
    return ws


@pytest.fixture
def server(workspace: Path, tmp_path: Path) -> Iterator[RawStdio]:
    srv = RawStdio(workspace, server_env(tmp_path / "state"))
    init, initialized = handshake("nonutf8")
    srv.send(init)
    assert "result" in srv.reply(0)
    srv.send(initialized)
    yield srv
    if srv.proc.poll() is None:
        srv.close()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _tool(srv: RawStdio, rid: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return srv.call(rid, "tools/call", {"name": name, "arguments": args})


def _wait_run(srv: RawStdio, run_id: str) -> dict[str, Any]:
    end = time.monotonic() + DEADLINE_S
    while True:
        msg = _tool(srv, f"wait-{time.monotonic()}", "job_status", {"run_id": run_id, "detail": True})
        data = msg["result"].get("structuredContent") or {}
        if data.get("state") != "running" or time.monotonic() > end:
            return msg
        time.sleep(0.5)


@pytest.mark.slow
def test_every_tool_resource_and_prompt_answers_without_lone_surrogates(server: RawStdio) -> None:
    tools = server.call("tools", "tools/list")["result"]["tools"]
    calls = _calls()
    assert sorted(calls) == sorted(t["name"] for t in tools), "every tool the server lists is called here"

    launched = _tool(server, "launch", "launch_training", {"job_dir": "job_run", "confirm": True})
    text = launched["result"]["content"][0]["text"]
    assert not launched["result"].get("isError"), text
    run_id = launched["result"]["structuredContent"]["run_id"]
    ended = _wait_run(server, run_id)
    assert ended["result"]["structuredContent"]["state"] == "failed", ended

    answered: dict[str, list[str]] = {}
    said: dict[str, str] = {}  # every string each tool's replies held
    bare: list[str] = []
    takes_detail = {t["name"] for t in tools if "detail" in t["inputSchema"].get("properties", {})}
    for name, given in calls.items():
        # the brief answer and the whole model (detail=true: every file name, evidence and path)
        variants = given + ([{**a, "detail": True} for a in given] if name in takes_detail else [])
        for i, args in enumerate(variants):
            args = {k: (run_id if v == RUN else v) for k, v in args.items()}
            msg = _tool(server, f"{name}-{i}", name, args)
            if "error" in msg:
                answered.setdefault(name, []).append(f"rpc error: {msg['error']['message'][:80]}")
                continue
            result = msg["result"]
            first = result["content"][0]["text"] if result.get("content") else ""
            if first.strip().startswith(f"Error executing tool {name}") and "\nfix:" not in first:
                bare.append(f"{name} {args}: {first[:300]}")
            answered.setdefault(name, []).append(("error: " if result.get("isError") else "") + first[:80])
            said[name] = said.get(name, "") + "\n".join(_strings(result))

    listed = server.call("resources", "resources/list")
    assert "result" in listed, listed
    uris = [r["uri"] for r in listed["result"]["resources"]]
    assert any("job_bad" in u for u in uris), "the job's UTF-8 files are still listed"
    for uri in [
        "mm-agent://jobs/job_bad",
        "mm-agent://jobs/job_bad/pretrain.sh",
        "mm-agent://jobs/job_run",
        "mm-agent://jobs/job_bad/cfg%FF%FE.json",
        "mm-agent://jobs/job_bad/cfg\ufffd\ufffd.json",
    ]:
        read = server.call(f"read {uri}", "resources/read", {"uri": uri})
        assert "result" in read or "error" in read
    for name, args in [
        (
            "finetune_generative",
            {"request": "fine-tune wan2.1", "dataset_dir": "ds_bad", "weights_dir": "weights_bad"},
        ),
        ("finetune_vlm", {"request": "fine-tune qwen2.5vl", "dataset_file": "ds_bad/index.csv"}),
        ("recover_failed_run", {"log_path": "logs_bad"}),
        ("recover_failed_run", {"run_id": run_id}),
        ("new_model", {"request": "add my own model", "name": "baddit", "checkout": "job_bad"}),
    ]:
        got = server.call(f"prompt {name} {args}", "prompts/get", {"name": name, "arguments": args})
        assert "result" in got or "error" in got

    still = server.call("last", "tools/list")  # the server is alive and answering
    assert len(still["result"]["tools"]) == len(tools)
    assert server.proc.poll() is None
    assert server.close() == 0
    assert not server.problems, "lines that break the wire format:\n" + "\n".join(server.problems[:10])
    assert not bare, "exceptions that escaped without their fix:\n" + "\n".join(bare)
    # the names are shown, escaped as Python's backslashreplace writes their bytes (not dropped or mangled)
    for tool, raw in [
        ("prepare_dataset", b"clip" + BAD + b".mp4"),
        ("diagnose_errors", b"rank" + BAD + b".log"),
        ("validate_configs", b"pretrain" + BAD + b".sh"),
        ("check_environment", b"pretrain" + BAD + b".sh"),
        ("tail_logs", b"out" + BAD + b".log"),
    ]:
        name = raw.decode("utf-8", "backslashreplace")  # clip\xff\xfe.mp4
        assert name in said[tool], f"{tool} does not name {name}"
    print(json.dumps(answered, indent=1, ensure_ascii=False))


def test_prepare_dataset_rejects_the_clip_with_a_reason_and_a_fix(server: RawStdio) -> None:
    """The issue's exact reproduction, and what the answer says: each clip whose name (or folder's name) is
    not UTF-8 is rejected, because data.json is UTF-8 and could not name it as MindSpeed-MM reads it; it is
    named escaped, with the rename as the fix; the other clips are judged as usual."""
    args = {"dir": "ds_bad", "model": "wan2.1", "task": "t2v", "detail": True}
    msg = _tool(server, 1, "prepare_dataset", args)
    assert not server.problems, server.problems
    result = msg["result"]
    assert not result.get("isError"), result["content"][0]["text"]
    data = result["structuredContent"]
    rejected = {r["path"]: r for r in data["rejected"]}
    for name in ("clip\\xff\\xfe.mp4", "sub\\xff\\xfe/inner.mp4"):
        assert name in rejected, rejected
        assert "not UTF-8" in rejected[name]["reason"]
        assert "convmv -f gbk -t utf8" in rejected[name]["fix"]
    assert data["stats"]["reasons"]["name_not_utf8"] == 2
    assert "not UTF-8" not in rejected.get("good.mp4", {}).get("reason", "")  # judged on its own merits
    assert "name_not_utf8" in result["content"][0]["text"]
    assert _tool(server, 2, "list_models", {})["result"]["content"]  # and it keeps answering


def _cli(args: list[str | bytes], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    argv = [os.fsencode(a) for a in [sys.executable, "-m", "mm_agent", *args]]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=300, check=False)


def _cli_cases(ws: Path) -> list[list[str | bytes]]:
    raw = os.fsencode(ws)
    return [
        ["dataset", str(ws / "ds_bad"), "--model", "wan2.1", "--task", "t2v"],
        ["diagnose", str(ws / "logs_bad")],
        ["diagnose", raw + b"/logs_bad/rank" + BAD + b".log"],
        ["validate", str(ws / "job_bad")],
        ["validate", raw + b"/job_bad/pretrain" + BAD + b".sh", str(ws / "job_bad" / "gbk_paths.sh")],
        ["doctor", "--job", str(ws / "job_bad"), "--check", "crlf_scripts", "disk_space"],
        ["doctor", "--job", raw + b"/job_bad/feat" + BAD, "--check", "crlf_scripts"],
        ["render", "wan2.1", "--task", "t2v", "--out", raw + b"/job" + BAD, "--dry-run"],
        [
            "render",
            "wan2.1",
            "--task",
            "t2v",
            "--out",
            raw + b"/job" + BAD,
            "--dataset-dir",
            raw + b"/ds_bad/sub" + BAD,
        ],
        [
            "convert",
            "WanConverter",
            "hf_to_mm",
            "--source",
            raw + b"/weights_bad/w" + BAD,
            "--target",
            raw + b"/w_mm" + BAD,
        ],
        ["estimate", str(ws / "job_bad")],
        ["extract", str(ws / "job_run")],
        ["train", raw + b"/job_bad/feat" + BAD],
        ["dataset", raw + b"/ds_bad/sub" + BAD, "--model", "wan2.1", "--task", "t2v"],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_cli_never_tracebacks_on_such_names(workspace: Path, tmp_path: Path, as_json: bool) -> None:
    # a UTF-8 terminal: strict UTF-8, as Python writes to one (under the C locale it would pass raw bytes)
    env = {**server_env(tmp_path / "state"), "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"}
    failures = []
    for args in _cli_cases(workspace):
        if as_json:
            args = [*args, "--json"]
        done = _cli(args, workspace, env)
        shown = (
            " ".join(os.fsdecode(a) if isinstance(a, bytes) else a for a in args)
            .encode("utf-8", "backslashreplace")
            .decode()
        )
        err = done.stderr.decode("utf-8", "backslashreplace")
        if "Traceback" in err or done.returncode not in (0, 1, 2):
            failures.append(f"{shown}: rc {done.returncode}\n{err[-1500:]}")
            continue
        for stream, data in (("stdout", done.stdout), ("stderr", done.stderr)):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                failures.append(f"{shown}: {stream} is not UTF-8 ({exc})")
                continue
            if as_json and stream == "stdout" and done.returncode == 0 and text.strip():
                found = surrogates(json.loads(text))
                if found:
                    failures.append(f"{shown}: --json holds lone surrogates {found[:2]}")
    assert not failures, "\n\n".join(failures)


# A server with tools added the way a future tool might be written carelessly: returning a result, raising an
# error and reporting progress with a raw non-UTF-8 name, none of it through the server's own helpers.
_CARELESS_SERVER = """
import os, sys
from pathlib import Path
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from mm_agent.server import build_server

NAME = os.fsdecode(b"clip\\xff\\xfe.mp4")
server = build_server(Path(sys.argv[1]))

async def careless_result() -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=NAME)], structured_content={NAME: [NAME]})

async def careless_error() -> str:
    raise ToolError(f"cannot read {NAME}")

async def careless_progress(ctx: Context) -> str:
    await ctx.report_progress(1, 2, NAME)
    return "done"

for fn in (careless_result, careless_error, careless_progress):
    server.add_tool(fn, name=fn.__name__, structured_output=False)
server.run()
"""


@pytest.mark.slow
def test_the_reply_boundary_escapes_what_any_tool_sends(tmp_path: Path) -> None:
    """The last line of defence: whatever a tool returns, raises or reports, the server writes it escaped
    and keeps answering (the SDK's writer would raise on a lone surrogate and the server would stop)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    srv = RawStdio(ws, server_env(tmp_path / "state"), argv=["-c", _CARELESS_SERVER, str(ws)])
    init, initialized = handshake("careless")
    srv.send(init)
    assert "result" in srv.reply(0)
    srv.send(initialized)
    # (the SDK itself may turn this one into an error reply: either way it is answered, and escaped)
    first = srv.call(1, "tools/call", {"name": "careless_result", "arguments": {}})
    if "result" in first:
        assert first["result"]["content"][0]["text"] == "clip\\xff\\xfe.mp4"
    error = srv.call(2, "tools/call", {"name": "careless_error", "arguments": {}})["result"]
    assert error["isError"] and "clip\\xff\\xfe.mp4" in error["content"][0]["text"]
    token = {"progressToken": "p"}
    done = srv.call(3, "tools/call", {"name": "careless_progress", "arguments": {}, "_meta": token})
    assert done["result"]["content"][0]["text"] == "done"
    assert len(srv.call(4, "tools/list")["result"]["tools"]) > 3  # still answering
    assert srv.close() == 0
    assert not srv.problems, srv.problems
