"""The fuzz run (issue 12, item 7): 600 hostile calls with a fixed seed against a real stdio server.

Every call must get an answer (a result, a tool error naming what is wrong, or a JSON-RPC error for an
unreadable line), the server must stay up, nothing may run (a canary file that injected commands would
create stays absent), nothing may be written outside the workspace, and no tool error may be the SDK's
bare "Error executing tool X" (an exception that escaped without its fix).
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from security.common import handshake

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


def _value(rng: random.Random, schema: dict[str, Any], defs: dict[str, Any], fill: dict[str, str]) -> Any:
    if "$ref" in schema:
        return _value(rng, defs[schema["$ref"].rsplit("/", 1)[-1]], defs, fill)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return _value(rng, rng.choice(options), defs, fill)
    if "enum" in schema and rng.random() < 0.7:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    roll = rng.random()
    if roll < 0.1:  # the wrong type altogether
        return rng.choice([None, 7, "x", [1], {"a": 1}, True])
    if kind == "string":
        if roll < 0.15:
            return "A" * rng.choice([5000, 70_000])
        return rng.choice(HOSTILE).format(**fill)
    if kind == "integer":
        return rng.choice(INTS)
    if kind == "number":
        return rng.choice(NUMBERS + INTS)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        item = schema.get("items", {})
        count = rng.choice([0, 1, 2, 3, 300])
        return [_value(rng, item, defs, fill) for _ in range(count)]
    if kind == "object":
        out: dict[str, Any] = {}
        for name, sub in schema.get("properties", {}).items():
            if rng.random() < 0.5:
                out[name] = _value(rng, sub, defs, fill)
        if isinstance(schema.get("additionalProperties"), dict) and rng.random() < 0.5:
            out[rng.choice(["LD_PRELOAD", "NCCL_DEBUG", "PATH", "X" * 200])] = rng.choice(HOSTILE).format(
                **fill
            )
        if rng.random() < 0.1:
            out["unexpected_field"] = 1
        return out
    return None


def _arguments(rng: random.Random, tool: dict[str, Any], fill: dict[str, str]) -> dict[str, Any]:
    schema = tool["inputSchema"]
    defs = schema.get("$defs", {})
    if rng.random() < 0.6:  # one hostile argument among sensible ones
        args = dict(TEMPLATES[tool["name"]])
        props = schema.get("properties", {})
        if props:
            name = rng.choice(sorted(props))
            args[name] = _value(rng, props[name], defs, fill)
    else:
        args = _value(rng, schema, defs, fill)
    if not isinstance(args, dict):  # the wrong type for the whole argument object
        args = {"unexpected": args}
    if tool["name"] in DRY_ONLY:
        args["confirm"] = False
    return args


def _deep(depth: int) -> str:
    """JSON nested `depth` levels deep (as text: json.dumps itself would recurse too far)."""
    return '{"x": ' * depth + '{"text": "x"}' + "}" * depth


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
            msg = server.reply(rid)
            if "error" in msg:
                kinds["rpc_error"] += 1
                assert msg["error"]["message"], msg
            elif msg["result"].get("isError"):
                kinds["tool_error"] += 1
                text = msg["result"]["content"][0]["text"]
                if text.strip() == f"Error executing tool {tool['name']}":
                    bare.append(f"{tool['name']}: {line[:300]}")
            else:
                kinds["result"] += 1
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
