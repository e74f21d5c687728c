"""A YAML alias bomb is refused, not expanded (issue 25, hole 2).

PyYAML composes an alias as a second reference to one node, so the 649-byte "billion laughs" file below
(11 levels of ten aliases each) loads at once into a structure of 10^12 nodes when walked. `validate_configs`
walked it (its line map, its rules) and grew past 4 GB, still growing after the call was answered
"abandoned"; a job.yaml holding one reached pydantic (doctor, launcher) and `str()` (prepare_dataset). Every
YAML a user or a job supplies is now read by `mm_agent.yamlload`, which counts what aliases expand to while
composing and refuses the file past `MAX_NODES` nodes or `MAX_DEPTH` levels, naming the file and the fix.

The core runs in a child interpreter under an address-space limit (so the code before the fix fails there
instead of exhausting this machine); the server is a real stdio `mm-agent serve` whose RSS is watched with
psutil and that is killed if it ever passes the bound.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from mm_agent import yamlload
from mm_agent.dataset import DatasetRequest, prepare_dataset
from mm_agent.errors import MMAgentError
from mm_agent.jobfile import load_job_spec
from mm_agent.validate.parse import Parsed, parse_yaml
from security.common import REPO, handshake, run_python

HANG_GUARD_S = 120  # never reached when the bomb is refused; a hang fails the test instead of the suite
RSS_BOUND = 500 * 1024 * 1024  # a resource bound: the server idles at ~100 MB; the bomb went past 4 GB
AS_LIMIT = 2 * 1024**3  # address space of the child running the core: far above a refusal's needs


def bomb() -> str:
    """The 649-byte bomb: 12 lists, each of ten aliases of the one before (10^12 leaves)."""
    names = "abcdefghijkl"
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [
        f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]" for prev, cur in itertools.pairwise(names)
    ]
    text = "# billion laughs: 11 levels of x10 aliases\n# padding..\n" + "\n".join(lines) + "\n"
    assert len(text.encode()) == 649
    return text


def _job(ws: Path) -> Path:
    """A job directory whose model config is the bomb."""
    job = ws / "job"
    job.mkdir(parents=True)
    (job / "model.yaml").write_text(bomb(), encoding="utf-8")
    return job


def test_the_core_refuses_the_bomb_naming_the_file(tmp_path: Path) -> None:
    job = _job(tmp_path / "ws")
    code = f"""
import json, resource
resource.setrlimit(resource.RLIMIT_AS, ({AS_LIMIT}, {AS_LIMIT}))
from pathlib import Path
from mm_agent.validate import ValidateRequest, validate_configs
report = validate_configs(ValidateRequest(paths=[{str(job)!r}]), root=Path({str(job.parent)!r}))
print(json.dumps(report.model_dump(mode="json")))
"""
    report = json.loads(run_python(code, HANG_GUARD_S, "validate_configs on the bomb"))
    assert report["ok"] is False
    (finding,) = [f for f in report["findings"] if f["rule"] == "yaml.limit"]
    assert finding["severity"] == "error" and finding["file"] == str(job / "model.yaml")
    assert "alias" in finding["message"] and f"{yamlload.MAX_NODES:,}" in finding["message"]
    assert "alias" in finding["fix"]


def _serve(ws: Path, tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "MM_AGENT_STATE_DIR": str(tmp_path / "state")}
    return subprocess.Popen(
        [sys.executable, "-m", "mm_agent", "serve", "--workspace", str(ws), "--tool-timeout", "30"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_the_stdio_server_answers_with_an_error_and_stays_small(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    job = _job(ws)
    proc = _serve(ws, tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    replies: dict[Any, dict[str, Any]] = {}
    answered = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            reply = json.loads(line)
            replies[reply.get("id")] = reply
            if "bomb" in replies:
                answered.set()
        answered.set()  # the server closed its output

    threading.Thread(target=read, daemon=True).start()
    call = {
        "jsonrpc": "2.0",
        "id": "bomb",
        "method": "tools/call",
        "params": {"name": "validate_configs", "arguments": {"paths": ["job"], "detail": True}},
    }
    server = psutil.Process(proc.pid)
    peak = 0
    try:
        proc.stdin.write("\n".join([*handshake("t"), json.dumps(call)]) + "\n")
        proc.stdin.flush()
        for _ in range(int(HANG_GUARD_S / 0.1)):
            peak = max(peak, server.memory_info().rss)
            assert peak < RSS_BOUND, f"the server grew to {peak >> 20} MB on a 649-byte file"
            if answered.wait(0.1):
                break
        assert "bomb" in replies, "no answer to the call"
        for _ in range(20):  # and nothing keeps growing after the answer
            peak = max(peak, server.memory_info().rss)
            assert peak < RSS_BOUND, f"the server grew to {peak >> 20} MB after answering"
            answered.wait(0.1)
    finally:
        proc.kill()
        proc.wait(HANG_GUARD_S)
    result = replies["bomb"]["result"]
    findings = result["structuredContent"]["findings"]
    (finding,) = [f for f in findings if f["rule"] == "yaml.limit"]
    assert finding["file"] == str(job / "model.yaml") and finding["severity"] == "error"
    assert result["structuredContent"]["ok"] is False


def test_a_bomb_in_job_yaml_is_refused_by_every_reader(tmp_path: Path) -> None:
    """job.yaml is read back by the doctor, the launcher and render --from (`load_job_spec`) and by
    prepare_dataset(job_dir=) (`dataset.target`); a bomb there is an error naming the file, not a walk.
    Both run in this process: the refusal happens while composing, before anything is expanded."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text("model: wan2.1\ntask: t2v\n" + bomb(), encoding="utf-8")
    with pytest.raises(MMAgentError) as err:
        load_job_spec(job / "job.yaml", tmp_path)
    assert err.value.file == str(job / "job.yaml") and "alias" in err.value.message
    assert err.value.fix and "alias" in err.value.fix
    (tmp_path / "clips").mkdir()
    with pytest.raises(MMAgentError) as err:
        prepare_dataset(DatasetRequest(dir="clips", model="wan2.1", job_dir="job"), root=tmp_path)
    assert err.value.file == str(job / "job.yaml") and "alias" in err.value.message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: " + "[" * 300 + "]" * 300 + "\n", f"deeper than {yamlload.MAX_DEPTH}"),
        ("a: &a [1, 2]\nb: &b [*b]\n", "recursive alias"),
        ("a: &a " + "[" * 150 + "1" + "]" * 150 + "\nb: " + "[" * 60 + "*a" + "]" * 60 + "\n", "deeper"),
    ],
)
def test_depth_and_recursive_aliases_are_refused(text: str, words: str) -> None:
    with pytest.raises(yamlload.YAMLLimit) as err:
        yamlload.safe_load(text)
    assert words in err.value.message and err.value.fix


def test_ordinary_anchors_still_load_and_keep_their_lines() -> None:
    """Anchors as configs use them (a shared block merged in, then overridden) read as before, and a key
    keeps the line it is written on, not its anchor's."""
    text = "base: &base {lr: 1.0e-5, wd: 0.01}\nstage1:\n  <<: *base\n  lr: 2.0e-5\nstage2: *base\n"
    parsed = parse_yaml(text)
    assert isinstance(parsed, Parsed)
    assert parsed.data == {
        "base": {"lr": 1e-5, "wd": 0.01},
        "stage1": {"lr": 2e-5, "wd": 0.01},
        "stage2": {"lr": 1e-5, "wd": 0.01},
    }
    assert parsed.lines["stage1.lr"] == 4 and parsed.lines["stage2"] == 5
