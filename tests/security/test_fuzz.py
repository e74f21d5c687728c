"""The fuzz run (issue 12, item 7): 600 hostile calls with a fixed seed against a real stdio server.

Every call must get an answer (a result, a tool error naming what is wrong, or a JSON-RPC error for an
unreadable line), the server must stay up, nothing may run (a canary file that injected commands would
create stays absent), nothing may be written outside the workspace, and no tool error may be the SDK's
bare "Error executing tool X" (an exception that escaped without its fix).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from security.common import handshake
from security.nonutf8 import RawStdio, build_workspace, server_env

SEED = 20261125
CALLS = 600
REPLY_TIMEOUT_S = 120.0  # a hang guard, not a timing assertion

# Values an attacker would send. {canary} becomes a path whose creation would prove a command ran.
HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    ";touch {canary};",
    "';touch {canary};'",
    '";touch {canary};"',
    "x$(touch {canary})y",
    "${{IFS}}touch${{IFS}}{canary}",
    "../../../etc/passwd",
    "/etc/passwd",
    "/etc/shadow",
    "{outside}",
    "{outside}/secret.txt",
    "~/.ssh/id_rsa",
    "%2e%2e/%2e%2e/x",
    "..",
    ".",
    "",
    " ",
    "-rf",
    "--index-url=http://127.0.0.1:9/simple",
    "git+https://127.0.0.1:9/evil.git",
    "a\nb",
    "a\rb",
    "a\x00b",
    "a\tb",
    "\u2028",
    "😀" * 40,
    "*",
    "jobs/f1",
    "jobs/f1/pretrain.sh",
    "logs",
    "link-out",
    "fifo",
    "loop/x",
    "wan2.1",
    "qwen2.5vl",
    "t2v",
    "sft",
    "WanConverter",
    "hf_to_mm",
]
INTS = [0, 1, -1, 2, 8, 6000, 65536, 10**9, 2**63, -(2**63)]
NUMBERS = [0.0, -1.0, 1e-5, 0.5, 1e308]

# Sensible arguments per tool; most calls mutate one field of these, so they reach deep code.
TEMPLATES: dict[str, dict[str, Any]] = {
    "list_models": {},
    "route_model": {"request": "fine-tune Wan2.1 t2v on 8 NPUs"},
    "render_job": {"model": "wan2.1", "task": "t2v", "out_dir": "jobs/f1", "confirm": True},
    "validate_configs": {"paths": ["jobs/f1"]},
    "diagnose_errors": {"paths": ["logs"]},
    "check_environment": {"checks": ["python_version", "shm"], "timeout_s": 5},
    "install_deps": {"model": "wan2.1"},
    "convert_weights": {"converter": "WanConverter", "method": "hf_to_mm", "source": "w", "target": "w-mm"},
    "extract_features": {"job_dir": "jobs/f1"},
    "launch_training": {"job_dir": "jobs/f1"},
    "job_status": {"run_id": "convert-0"},
    "tail_logs": {"run_id": "convert-0"},
    "stop_job": {"run_id": "convert-0"},
    "prepare_dataset": {"dir": ".", "model": "wan2.1"},
    "estimate_resources": {"model": "wan2.1", "size": "1.3b", "npus": 8},
    "scaffold_model": {
        "name": "fuzzdit",
        "out": "new_models/fuzzdit",
        "layers": 2,
        "heads": 2,
        "confirm": True,
    },
}
# Never start real work in a fuzz run: these stay dry runs whatever the fuzzer picks.
DRY_ONLY = {
    "install_deps",
    "convert_weights",
    "extract_features",
    "launch_training",
    "stop_job",
    "prepare_dataset",
}


class Stdio:
    """A real `mm-agent serve` over stdio, spoken to line by line."""

    def __init__(self, ws: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(ws)],
            cwd=str(ws),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self, rid: Any) -> dict[str, Any]:
        while True:
            try:
                msg = json.loads(self.lines.get(timeout=REPLY_TIMEOUT_S))
            except queue.Empty:
                raise AssertionError(f"no reply to request {rid!r}") from None
            if "id" in msg and msg["id"] == rid:
                return dict(msg)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def _value(
    rng: random.Random,
    schema: dict[str, Any],
    defs: dict[str, Any],
    fill: dict[str, str],
    hostile: list[str] = HOSTILE,
) -> Any:
    if "$ref" in schema:
        return _value(rng, defs[schema["$ref"].rsplit("/", 1)[-1]], defs, fill, hostile)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return _value(rng, rng.choice(options), defs, fill, hostile)
    if "enum" in schema and rng.random() < 0.7:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    roll = rng.random()
    if roll < 0.1:  # the wrong type altogether
        return rng.choice([None, 7, "x", [1], {"a": 1}, True])
    if kind == "string":
        if roll < 0.15:
            return "A" * rng.choice([5000, 70_000])
        return rng.choice(hostile).format(**fill)
    if kind == "integer":
        return rng.choice(INTS)
    if kind == "number":
        return rng.choice(NUMBERS + INTS)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        item = schema.get("items", {})
        count = rng.choice([0, 1, 2, 3, 300])
        return [_value(rng, item, defs, fill, hostile) for _ in range(count)]
    if kind == "object":
        out: dict[str, Any] = {}
        for name, sub in schema.get("properties", {}).items():
            if rng.random() < 0.5:
                out[name] = _value(rng, sub, defs, fill, hostile)
        if isinstance(schema.get("additionalProperties"), dict) and rng.random() < 0.5:
            out[rng.choice(["LD_PRELOAD", "NCCL_DEBUG", "PATH", "X" * 200])] = rng.choice(hostile).format(
                **fill
            )
        if rng.random() < 0.1:
            out["unexpected_field"] = 1
        return out
    return None


def _arguments(
    rng: random.Random,
    tool: dict[str, Any],
    fill: dict[str, str],
    templates: dict[str, dict[str, Any]] = TEMPLATES,
    hostile: list[str] = HOSTILE,
) -> dict[str, Any]:
    schema = tool["inputSchema"]
    defs = schema.get("$defs", {})
    if rng.random() < 0.6:  # one hostile argument among sensible ones
        args = dict(templates[tool["name"]])
        props = schema.get("properties", {})
        if props:
            name = rng.choice(sorted(props))
            args[name] = _value(rng, props[name], defs, fill, hostile)
    else:
        args = _value(rng, schema, defs, fill, hostile)
    if not isinstance(args, dict):  # the wrong type for the whole argument object
        args = {"unexpected": args}
    if tool["name"] in DRY_ONLY:
        args["confirm"] = False
    return args


def _deep(depth: int) -> str:
    """JSON nested `depth` levels deep (as text: json.dumps itself would recurse too far)."""
    return '{"x": ' * depth + '{"text": "x"}' + "}" * depth


def _tally(msg: dict[str, Any], tool: str, line: str, kinds: dict[str, int], bare: list[str]) -> None:
    """Count one answer by kind; a tool error that is only the SDK's bare "Error executing tool X" (an
    exception that escaped without its fix) is kept with the call that caused it."""
    if "error" in msg:
        kinds["rpc_error"] += 1
        assert msg["error"]["message"], msg
    elif msg["result"].get("isError"):
        kinds["tool_error"] += 1
        if msg["result"]["content"][0]["text"].strip() == f"Error executing tool {tool}":
            bare.append(f"{tool}: {line[:300]!r}")
    else:
        kinds["result"] += 1


def _workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    ws = tmp_path / "ws"
    (ws / "logs").mkdir(parents=True)
    (ws / "logs" / "rank0.log").write_text("iteration 1/10 | lm loss: 1.0\n", encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n", encoding="utf-8")
    (ws / "link-out").symlink_to(outside, target_is_directory=True)
    (ws / "loop").symlink_to(ws / "loop")
    os.mkfifo(ws / "fifo")
    fill = {"canary": str(tmp_path / "CANARY"), "outside": str(outside)}
    return ws, fill


@pytest.mark.slow
def test_fuzz_600_calls_every_one_answered_nothing_runs(tmp_path: Path) -> None:
    ws, fill = _workspace(tmp_path)
    env = {
        **os.environ,
        "MM_AGENT_STATE_DIR": str(tmp_path / "state"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    rng = random.Random(SEED)
    server = Stdio(ws, env)
    try:
        init, initialized = handshake("fuzz")
        server.send(init)
        assert "result" in server.reply(0)
        server.send(initialized)
        server.send(json.dumps({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"}))
        tools = server.reply("tools")["result"]["tools"]
        assert len(tools) == len(TEMPLATES)
        kinds = {"result": 0, "tool_error": 0, "rpc_error": 0}
        bare: list[str] = []
        for rid in range(1, CALLS + 1):
            roll = rng.random()
            tool = rng.choice(tools)
            if roll < 0.04:  # nested past the parser's limit
                head = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call"})[:-1]
                deep = _deep(rng.choice([250, 1000]))
                args = '{"name": ' + json.dumps(tool["name"]) + ', "arguments": {"x": ' + deep + "}}"
                line = f'{head}, "params": {args}}}'
            elif roll < 0.07:  # not JSON at all, or cut short
                line = rng.choice([f'{{"jsonrpc": "2.0", "id": {rid}, "method": ', f'{{"id": {rid}, []}}'])
            else:
                line = json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "method": "tools/call",
                        "params": {"name": tool["name"], "arguments": _arguments(rng, tool, fill)},
                    }
                )
            server.send(line)
            _tally(server.reply(rid), tool["name"], line, kinds, bare)
        server.send(json.dumps({"jsonrpc": "2.0", "id": "last", "method": "tools/list"}))
        assert len(server.reply("last")["result"]["tools"]) == len(TEMPLATES)  # still up and answering
        assert server.proc.poll() is None
    finally:
        code = server.close()
    print(f"fuzz: {CALLS} calls answered: {kinds}")
    assert code == 0
    assert not bare, "errors without their fix:\n" + "\n".join(bare)
    assert not (tmp_path / "CANARY").exists(), "an injected command ran"
    assert {p.name for p in tmp_path.iterdir()} <= {*before, "state"}
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret.txt"]
    assert all(kinds.values()), kinds  # the run reached results, tool errors and protocol errors


# -- issue 25: a new seed, in a workspace whose files and folders have names that are not UTF-8 ----------

NONUTF8_SEED = 20261128
NONUTF8_CALLS = 1500
IN_FLIGHT = [1, 1, 2, 4, 8, 16]  # calls sent before the first of them is awaited; the descendants are looked
# at after each batch
# Values that lead to the non-UTF-8 names of security/nonutf8.py's workspace, or look like them: the escaped
# form replies show, and what a client that decoded a listing with errors="replace" would send back.
NONUTF8_VALUES = [
    "ds_bad",
    "ds_link",
    "logs_bad",
    "job_bad",
    "job_link",
    "job_run",
    "job_force",
    "weights_bad",
    "weights_bad/transformer",
    "w_link",
    "job_bad/gbk_paths.sh",
    "ds_bad/index.csv",
    "ds_bad/clip\\xff\\xfe.mp4",
    "job_bad/pretrain\\xff\\xfe.sh",
    "logs_bad/rank\\xff\\xfe.log",
    "ds_bad/clip\ufffd\ufffd.mp4",
    "job\ufffd\ufffd",
    "job_bad/cfg\ufffd\ufffd.json",
]
NONUTF8_TEMPLATES: dict[str, dict[str, Any]] = {
    **TEMPLATES,
    "render_job": {
        "model": "wan2.1",
        "task": "t2v",
        "out_dir": "jobs/f1",
        "dataset_dir": "ds_bad",
        "weights_dir": "weights_bad",
        "confirm": True,
    },
    "validate_configs": {"paths": ["job_bad", "job_link"]},
    "diagnose_errors": {"paths": ["logs_bad", "job_run"]},
    "check_environment": {"job": "job_bad", "checks": ["crlf_scripts", "disk_space"], "timeout_s": 5},
    "install_deps": {"model": "wan2.1", "mm_root": "job_bad"},
    "convert_weights": {
        "converter": "WanConverter",
        "method": "hf_to_mm",
        "source": "weights_bad/transformer",
        "target": "w-mm",
    },
    "extract_features": {"job_dir": "job_link"},
    "launch_training": {"job_dir": "job_bad"},
    "prepare_dataset": {"dir": "ds_bad", "model": "wan2.1", "task": "t2v"},
    "estimate_resources": {"model": "wan2.1", "job_dir": "job_bad"},
    "scaffold_model": {"name": "fuzzdit", "checkout": "job_bad", "confirm": True},
}
IN_FLIGHT_AT_EXIT = [
    ("check_environment", {"job": "job_bad", "timeout_s": 60}),  # every check: probes in subprocesses
    ("prepare_dataset", {"dir": "ds_bad", "model": "wan2.1", "task": "t2v"}),  # a process pool
]
RESOURCE_URIS = [
    "mm-agent://jobs/job_bad",
    "mm-agent://jobs/job_run",
    "mm-agent://jobs/job_bad/pretrain.sh",
    "mm-agent://jobs/job_bad/cfg%FF%FE.json",
    "mm-agent://jobs/job_link/job.yaml",
    "mm-agent://jobs/ds_bad",
    "mm-agent://models/wan2.1",
]


def _descendants(pid: int) -> list[psutil.Process]:
    """The live (not zombie) processes under `pid` now."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    live = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                live.append(child)
    return live


def _other_call(rng: random.Random, rid: int, run_id: str) -> dict[str, Any]:
    """A resource or prompt request whose arguments reach the same names."""
    roll = rng.random()
    if roll < 0.3:
        return {"jsonrpc": "2.0", "id": rid, "method": "resources/list"}
    if roll < 0.6:
        uri = rng.choice([*RESOURCE_URIS, f"mm-agent://jobs/{rng.choice(NONUTF8_VALUES)}"])
        return {"jsonrpc": "2.0", "id": rid, "method": "resources/read", "params": {"uri": uri}}
    value = rng.choice(NONUTF8_VALUES)
    name, args = rng.choice(
        [
            (
                "finetune_generative",
                {"request": "fine-tune wan2.1", "dataset_dir": value, "weights_dir": value},
            ),
            ("finetune_vlm", {"request": "fine-tune qwen2.5vl", "dataset_file": value}),
            ("recover_failed_run", {"log_path": value}),
            ("recover_failed_run", {"run_id": run_id}),
        ]
    )
    return {"jsonrpc": "2.0", "id": rid, "method": "prompts/get", "params": {"name": name, "arguments": args}}


def _nonutf8_line(
    rng: random.Random,
    rid: int,
    tools: list[dict[str, Any]],
    fill: dict[str, str],
    templates: dict[str, dict[str, Any]],
    hostile: list[str],
    run_id: str,
) -> tuple[str, str | bytes]:
    """(the tool called, or "" for anything else; the line to send)."""
    roll = rng.random()
    tool = rng.choice(tools)
    if roll < 0.03:  # JSON's escape of a lone surrogate: valid JSON text, no valid string
        head = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call"})[:-1]
        name = json.dumps(tool["name"])
        return "", f'{head}, "params": {{"name": {name}, "arguments": {{"paths": ["x\\udcff\\udcfe"]}}}}}}'
    if roll < 0.06:  # bytes that are not UTF-8 in the line itself
        head = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call"})[:-1]
        name = rng.choice(["validate_configs", "diagnose_errors"])
        line = f'{head}, "params": {{"name": "{name}", "arguments": {{"paths": ["'.encode()
        line += rng.choice([b"job_bad/pretrain\xff\xfe.sh", b"logs_bad/rank\xff\xfe.log", b"\xff"])
        return name, line + b'"]}}}'
    if roll < 0.16:
        return "", json.dumps(_other_call(rng, rid, run_id))
    args = _arguments(rng, tool, fill, templates, hostile)
    params = {"name": tool["name"], "arguments": args}
    return tool["name"], json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})


@pytest.mark.slow
def test_fuzz_nonutf8_names_every_call_answered_no_process_left(tmp_path: Path) -> None:
    """Issue 25's "done when": a fuzz run with a new seed whose workspace holds files and folders named with
    bytes that are not UTF-8 (and arguments that lead there), plus resources, prompts and lines that are not
    UTF-8 or carry JSON's lone-surrogate escapes. Every call is answered, every line the server writes is
    strict UTF-8 JSON without a lone surrogate, the server stays up, and no process it started outlives it."""
    ws, fill = _workspace(tmp_path)
    build_workspace(ws)
    env = server_env(tmp_path / "state")
    before = sorted(p.name for p in tmp_path.iterdir())
    rng = random.Random(NONUTF8_SEED)
    hostile = HOSTILE + NONUTF8_VALUES
    server = RawStdio(ws, env)
    seen: dict[tuple[int, float], tuple[psutil.Process, str]] = {}  # (pid, start) -> process, its command

    def look() -> None:
        for proc in _descendants(server.proc.pid):
            with contextlib.suppress(psutil.Error):
                key = (proc.pid, proc.create_time())
                if key not in seen:
                    seen[key] = (proc, " ".join(proc.cmdline())[:160])

    kinds = {"result": 0, "tool_error": 0, "rpc_error": 0}
    bare: list[str] = []
    try:
        init, initialized = handshake("fuzz-nonutf8")
        server.send(init)
        assert "result" in server.reply(0)
        server.send(initialized)
        tools = server.call("tools", "tools/list")["result"]["tools"]
        assert len(tools) == len(NONUTF8_TEMPLATES)
        # one real run whose log holds such bytes and names (its script prints them, then fails)
        started = server.call(
            "run",
            "tools/call",
            {"name": "launch_training", "arguments": {"job_dir": "job_run", "confirm": True}},
        )
        run_id = started["result"]["structuredContent"]["run_id"]
        look()
        templates = {
            **NONUTF8_TEMPLATES,
            **{t: {"run_id": run_id} for t in ("job_status", "tail_logs", "stop_job")},
        }
        rid = 0
        while rid < NONUTF8_CALLS:  # batches of calls in flight together, as a busy client sends them
            batch = []
            for _ in range(min(rng.choice(IN_FLIGHT), NONUTF8_CALLS - rid)):
                rid += 1
                name, line = _nonutf8_line(rng, rid, tools, fill, templates, hostile, run_id)
                server.send(line)
                batch.append((rid, name, line))
            for sent, name, line in batch:
                _tally(server.reply(sent), name, line, kinds, bare)
            look()
        last = server.call("last", "tools/list")
        assert len(last["result"]["tools"]) == len(tools)  # still up and answering
        assert server.proc.poll() is None
        # Last, calls that start processes (contained probes, a pool) are left in flight as the client goes
        # away: what they started is looked at while they run, and must be gone with the server.
        known = set(seen)
        for n, (name, args) in enumerate(IN_FLIGHT_AT_EXIT):
            params = {"name": name, "arguments": args}
            server.send(
                json.dumps({"jsonrpc": "2.0", "id": f"exit{n}", "method": "tools/call", "params": params})
            )
        deadline = time.monotonic() + REPLY_TIMEOUT_S  # hang guard: the probes start within seconds
        while set(seen) == known and server.lines.empty() and time.monotonic() < deadline:
            look()
            time.sleep(0.05)
        look()
    finally:
        code = server.close()
    print(f"fuzz (non-UTF-8 names): {NONUTF8_CALLS} calls answered: {kinds}; descendants seen:")
    print("\n".join(f"  {key[0]}: {command}" for key, (_, command) in seen.items()))
    assert code == 0
    assert not server.problems, "lines that break the wire format:\n" + "\n".join(server.problems[:10])
    assert not bare, "errors without their fix:\n" + "\n".join(bare)
    # Nothing the server started outlives it (hang guard only: a process still exiting gets its time).
    _, alive = psutil.wait_procs([proc for proc, _ in seen.values()], timeout=REPLY_TIMEOUT_S)
    left = [f"{p.pid}: {command}" for p, command in seen.values() if p in alive and p.is_running()]
    assert not left, "processes left behind by the server:\n" + "\n".join(left)
    assert not (tmp_path / "CANARY").exists(), "an injected command ran"
    assert {p.name for p in tmp_path.iterdir()} <= {*before, "state"}
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret.txt"]
    assert all(kinds.values()), kinds
