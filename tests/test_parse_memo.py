"""The server remembers parsed job files by their text (`mm_agent.memo`), which made validate_configs several
times faster on a job validated again and again. What is remembered must never be stale or shared: a file
changed in place (same size, same mtime: a timestamp cannot tell) is read anew, and a rule that changes what
it was given cannot change what the next call reads. `names.shown_data`'s one-pass check of an answer keeps
escaping what is not UTF-8 and returns the very object otherwise."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mcp.types import JSONRPCResponse
from pydantic import BaseModel

from mm_agent import memo
from mm_agent.names import shown_data
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import ValidateRequest, validate_configs


def _job(ws: Path) -> Path:
    (ws / "data").mkdir()
    (ws / "data" / "data.json").write_text(json.dumps([{"path": "a.mp4", "cap": "a cat"}]), encoding="utf-8")
    request = RenderRequest(
        model="wan2.1",
        task="t2v",
        size="1.3b",
        runtime="bundled",
        device="cpu",
        npus_per_node=1,
        dataset_dir="data",
        dataset_file="data/data.json",
        out_dir="job",
        confirm=True,
    )
    render_job(request, root=ws)
    return ws / "job"


def _findings(ws: Path) -> list[tuple[str, str, str]]:
    report = validate_configs(ValidateRequest(paths=["job"]), root=ws)
    return [(f.severity, f.rule, f.file) for f in report.findings]


def test_a_file_changed_in_place_is_read_anew(ws: Path) -> None:
    job = _job(ws)
    first = _findings(ws)
    assert first == _findings(ws)  # the second call, from what was remembered: the same answer
    config = next(p for p in sorted(job.rglob("*.json")) if p.read_text(encoding="utf-8").startswith("{"))
    before = config.stat()
    text = config.read_text(encoding="utf-8")
    config.write_text("[" + text[1:], encoding="utf-8")  # same size: now not valid JSON
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    broken = _findings(ws)
    assert ("error", "json.syntax", str(config)) in broken, broken
    config.write_text(text, encoding="utf-8")
    assert _findings(ws) == first


def test_a_caller_changing_what_it_got_does_not_change_the_next_answer() -> None:
    parsed = memo.remembered("test", None, "a: 1", lambda: {"a": [1]})
    parsed["a"].append(2)
    assert memo.remembered("test", None, "a: 1", lambda: {"a": ["parsed again"]}) == {"a": [1]}


class _Named(BaseModel):
    name: str


def test_shown_data_escapes_what_is_not_utf8_and_keeps_the_rest() -> None:
    clean = {"files": ["a.mp4", "b.mp4"], "count": 2, "ok": True, "ratio": 0.5}
    assert shown_data(clean) is clean  # nothing to escape: not copied
    bad = {"files": ["ok.mp4", "clip\udcff.mp4"], "nested": {"name\udcfe": 1}}
    assert shown_data(bad) == {"files": ["ok.mp4", "clip\\xff.mp4"], "nested": {"name\\xfe": 1}}
    inside = {"item": _Named(name="x\udcff")}  # a model inside: not plain JSON, walked
    assert shown_data(inside)["item"].name == "x\\xff"


def test_shown_data_checks_a_message_result_in_one_pass() -> None:
    clean = JSONRPCResponse(jsonrpc="2.0", id=1, result={"content": [{"type": "text", "text": "ok"}]})
    assert shown_data(clean) is clean
    bad = JSONRPCResponse(jsonrpc="2.0", id=1, result={"content": [{"type": "text", "text": "a\udcffb"}]})
    assert shown_data(bad).result == {"content": [{"type": "text", "text": "a\\xffb"}]}
