"""Shared by the non-UTF-8 name tests and the fuzz run (issue 25): a workspace whose files and folders have
names that are not UTF-8, and a stdio server read as raw bytes.

Names like these come from archives unzipped from Windows/GBK machines. Python hands them around as `str`
with lone surrogates (PEP 383, surrogateescape); text with a lone surrogate cannot be written as UTF-8, so a
reply carrying one killed the server's writer. Every line the server writes is therefore read as bytes and
must decode as strict UTF-8 and parse as JSON without a lone surrogate (JSON's `\\udcff` escapes included).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from mm_agent.render import RenderRequest, render_job

BAD = b"\xff\xfe"  # what an unzipped GBK/UTF-16 name looks like to a UTF-8 system
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLY_TIMEOUT_S = 120.0  # a hang guard, not a timing assertion
# diffusers' config.json of Wan2.1-T2V-1.3B's transformer (what render and convert read from weights)
WAN_1_3B = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2],
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
}


def bad(name: bytes) -> str:
    """The str Python uses for a name made of these bytes (undecodable bytes become lone surrogates)."""
    return os.fsdecode(name)


def surrogates(value: Any, where: str = "") -> list[str]:
    """Where `value` (parsed JSON) holds a string with a lone surrogate; empty when it holds none."""
    if isinstance(value, str):
        return [f"{where}: {value!r}"[:300]] if LONE_SURROGATE.search(value) else []
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in surrogates(k, where) + surrogates(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in surrogates(v, f"{where}[{i}]")]
    return []


def _clip(path: Path, grey: int = 90) -> None:
    from runtime.synth import write_mp4  # PyAV: the runtime extra, installed with the test environment

    write_mp4(path, np.full((17, 64, 64, 3), grey, np.uint8), 16)


def _job(ws: Path, name: str, **fields: Any) -> Path:
    render_job(
        RenderRequest(**{"model": "wan2.1", "task": "t2v", "out_dir": name, "confirm": True, **fields}),
        root=ws,
    )
    return ws / name


def build_workspace(ws: Path) -> None:
    """Every kind of place a tool reads where a non-UTF-8 name (or such bytes in a file) can sit.

    ds_bad     clips and captions named with \\xff\\xfe, a folder so named, an index naming such a clip
    logs_bad   a log so named, holding such bytes and such a path
    job_bad    a rendered job holding a script, a config and a folder so named, and a script whose text
               names such paths
    weights_bad  HF weights holding a shard and a folder so named
    job_link, ds_link, w_link  symlinks to a rendered job, a clip folder and a weights folder so named
    job_force  a rendered job holding an output so named
    job_run    a bundled job whose training script prints such bytes and names, then fails
    """
    ws.mkdir(parents=True, exist_ok=True)
    ds = ws / "ds_bad"
    ds.mkdir()
    _clip(ds / bad(b"clip" + BAD + b".mp4"))
    (ds / bad(b"clip" + BAD + b".txt")).write_bytes(b"a grey square, caption from a GBK machine \xff\xfe\n")
    _clip(ds / "good.mp4", 120)
    (ds / "good.txt").write_text("a lighter grey square\n", encoding="utf-8")
    sub = ds / bad(b"sub" + BAD)
    sub.mkdir()
    shutil.copy(ds / "good.mp4", sub / "inner.mp4")
    (sub / "inner.txt").write_text("inside a folder with a GBK name\n", encoding="utf-8")
    (ds / "index.csv").write_bytes(b"path,cap\nclip" + BAD + b".mp4,grey\ngood.mp4,lighter\n")

    logs = ws / "logs_bad"
    logs.mkdir()
    (logs / bad(b"rank" + BAD + b".log")).write_bytes(
        b"iteration 1/10 | lm loss: 1.0\n"
        b"Traceback (most recent call last):\n"
        b"FileNotFoundError: [Errno 2] No such file or directory: '/data/clip" + BAD + b".mp4'\n"
        b"RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB \xff\xfe\n"
    )

    job = _job(ws, "job_bad")
    (job / bad(b"pretrain" + BAD + b".sh")).write_bytes((job / "pretrain.sh").read_bytes())
    (job / bad(b"cfg" + BAD + b".json")).write_text("{}\n", encoding="utf-8")
    (job / bad(b"cfg" + BAD + b".yaml")).write_text("a: 1\n", encoding="utf-8")
    (job / bad(b"feat" + BAD)).mkdir()
    (job / bad(b"feat" + BAD) / bad(b"x" + BAD + b".pt")).write_bytes(b"\x00" * 16)
    (job / "gbk_paths.sh").write_bytes(
        b"#!/bin/bash\nMM_ROOT=/opt/mm" + BAD + b"\nDATA=/data/clip" + BAD + b".mp4\n"
        b'torchrun pretrain_sora.py --data-path "$DATA" --load /ckpt' + BAD + b"\n"
    )

    weights = ws / "weights_bad"
    (weights / "transformer").mkdir(parents=True)
    (weights / "transformer" / "config.json").write_text(json.dumps(WAN_1_3B), encoding="utf-8")
    shard = b"diffusion_pytorch_model" + BAD + b".safetensors"
    (weights / "transformer" / bad(shard)).write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    (weights / bad(b"w" + BAD)).mkdir()
    (weights / bad(b"w" + BAD) / bad(shard)).write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")

    # UTF-8 names that lead to folders whose names are not: every path argument can reach such a name so
    # (rendered under a UTF-8 name, then renamed: a request's path must be valid text, see test_cli_...)
    gbk_job = _job(ws, "job_gbk", npus_per_node=1, runtime="bundled").rename(ws / bad(b"job" + BAD))
    (gbk_job / "sora_features").mkdir(exist_ok=True)
    (gbk_job / "sora_features" / "data.jsonl").write_text("", encoding="utf-8")
    (ws / "job_link").symlink_to(gbk_job.name, target_is_directory=True)
    (ws / "ds_link").symlink_to(f"ds_bad/{bad(b'sub' + BAD)}", target_is_directory=True)
    (ws / "w_link").symlink_to(f"weights_bad/{bad(b'w' + BAD)}", target_is_directory=True)

    force = _job(ws, "job_force")  # re-rendered with force: its outputs, such names among them, move
    (force / bad(b"sample" + BAD + b".mp4")).write_bytes(b"not a real video")

    run = _job(
        ws,
        "job_run",
        npus_per_node=1,
        weights_dir="weights_bad",
        dataset_dir="ds_bad",
        runtime="bundled",
    )
    (run / "sora_features").mkdir(exist_ok=True)
    (run / "sora_features" / "data.jsonl").write_text("", encoding="utf-8")
    (run / bad(b"out" + BAD + b".log")).write_bytes(b"output \xff\xfe\n")
    # The training script, replaced by one that fails at once, printing such bytes and names (ls) as a
    # real script that lists its data would.
    (run / "pretrain.sh").write_bytes(
        b"#!/bin/bash\n"
        b"printf 'loading /data/clip\\377\\376.mp4\\n'\n"
        b'ls "$(dirname "$0")"\n'
        b"printf 'FileNotFoundError: [Errno 2] No such file or directory: clip\\377\\376.mp4\\n' >&2\n"
        b"exit 1\n"
    )


def server_env(state: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MM_AGENT_STATE_DIR": str(state),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


class RawStdio:
    """A real `mm-agent serve` over stdio whose output is kept as bytes: each line is checked as the wire
    format demands (strict UTF-8, JSON, no lone surrogate) before anything else reads it."""

    def __init__(self, ws: Path, env: dict[str, str], argv: list[str] | None = None) -> None:
        """`argv`: what the interpreter runs instead of `-m mm_agent serve --workspace ws`."""
        self.proc = subprocess.Popen(
            [sys.executable, *(argv or ["-m", "mm_agent", "serve", "--workspace", str(ws)])],
            cwd=str(ws),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.problems: list[str] = []  # lines that broke the wire format, with why
        self.replies: dict[Any, dict[str, Any]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, line: str | bytes) -> None:
        """One line; bytes go as they are (a client may send bytes that are not UTF-8 too)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
        self.proc.stdin.flush()

    def call(self, rid: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message))
        return self.reply(rid)

    def _parse(self, raw: bytes) -> dict[str, Any] | None:
        try:
            msg = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            self.problems.append(f"not UTF-8 JSON ({exc}): {raw[:300]!r}")
            try:  # still find which request it answers, so the test reports instead of waiting
                msg = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                return None
            return dict(msg) if isinstance(msg, dict) else None
        found = surrogates(msg)
        if found:
            self.problems.append("lone surrogates: " + "; ".join(found[:3]))
        return dict(msg) if isinstance(msg, dict) else None

    def reply(self, rid: Any) -> dict[str, Any]:
        """The reply to request `rid` (replies to others that come first are kept for their turn; every
        notification is checked too). EOF or silence fails."""
        while rid not in self.replies:
            try:
                raw = self.lines.get(timeout=REPLY_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"no reply to request {rid!r}") from None
            if not raw:
                self.lines.put(b"")  # stays at EOF for any later reader
                raise AssertionError(f"the server closed its output before answering {rid!r}")
            msg = self._parse(raw)
            if msg is not None and "id" in msg and "method" not in msg:
                self.replies[msg["id"]] = msg
        return self.replies.pop(rid)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
