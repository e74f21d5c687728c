"""Code of a workspace directory runs only when the operator said so (issue 25, medium hole).

Holes guarded here: `validate_configs(mm_root=…)`, annotated read-only, ran any directory's Python with no
confirmation: `mmparser_child.py` puts mm_root first on sys.path and imports `megatron`, so a planted
`megatron/__init__.py` in a folder under the workspace ran, and the answer said "ok". Now the server runs a
checkout's code only inside a directory its operator trusted (`mm-agent serve --trust-mm-root DIR`); any other
mm_root gets a dry-run answer naming what would run and how to allow it. The CLI (the operator) runs it and says
so. `check_environment(python=<workspace venv>/bin/python)` ran that venv's `site-packages/*.pth` import lines:
every probe now runs with `-I -S`, its site-packages put on sys.path without executing a .pth line.
All through real clients: an in-process MCP client, the `mm-agent` CLI in a subprocess, real venvs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mm_agent.doctor import DoctorReport
from mm_agent.server import build_server

REPO = Path(__file__).resolve().parents[2]
JOB_FIXTURE = REPO / "tests" / "fixtures" / "jobs" / "wan21_t2v"
HANG_GUARD_S = 240  # the parser child and the probes answer in seconds; a hang fails the test instead


@pytest.fixture(autouse=True)
def _no_mm_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient MM_ROOT: the workspace (`ws`, tests/conftest.py) is all these tests see."""
    monkeypatch.delenv("MM_ROOT", raising=False)


def _call(ws: Path, tool: str, args: dict[str, Any], **server: Any) -> Any:
    async def go() -> Any:
        with anyio.fail_after(HANG_GUARD_S):
            async with Client(build_server(ws, **server)) as client:
                return await client.call_tool(tool, args)

    return anyio.run(go)


def _annotations(ws: Path, **server: Any) -> Any:
    async def go() -> Any:
        async with Client(build_server(ws, **server)) as client:
            return {t.name: t.annotations for t in (await client.list_tools()).tools}

    return anyio.run(go)


def _text(result: Any) -> str:
    assert not result.is_error, result.content[0].text
    text: str = result.content[0].text
    return text


# ---------------------------------------------------------------------------------------------------------
# validate_configs(mm_root=...)


def _planted(ws: Path) -> tuple[Path, Path]:
    """A folder shaped like a MindSpeed-MM checkout whose `megatron/__init__.py` writes a canary when imported,
    and a real job (the wan2.1 fixture) whose torchrun launch its parser would judge."""
    canary = ws.parent / "canary-megatron"
    checkout = ws / "downloads" / "MindSpeed-MM"
    (checkout / "mindspeed_mm").mkdir(parents=True)
    (checkout / "mindspeed_mm" / "arguments.py").write_text("", encoding="utf-8")
    (checkout / "pretrain_sora.py").write_text(
        "from mindspeed_mm.configs.config import mm_extra_args_provider\n", encoding="utf-8"
    )
    (checkout / "megatron").mkdir()
    (checkout / "megatron" / "__init__.py").write_text(
        f"open({str(canary)!r}, 'w').write('ran')\n", encoding="utf-8"
    )
    shutil.copytree(JOB_FIXTURE, ws / "job")
    return checkout, canary


def test_an_untrusted_mm_root_is_not_run_over_mcp_and_the_answer_says_how_to_allow_it(ws: Path) -> None:
    checkout, canary = _planted(ws)
    text = _text(_call(ws, "validate_configs", {"paths": ["job"], "mm_root": "downloads/MindSpeed-MM"}))
    assert not canary.exists(), "validate_configs ran the checkout's megatron/__init__.py"
    assert "not run" in text and str(checkout) in text, text
    assert "--trust-mm-root" in text and "mm-agent validate" in text, text  # both ways to allow it
    detail = _call(
        ws, "validate_configs", {"paths": ["job"], "mm_root": "downloads/MindSpeed-MM", "detail": True}
    )
    (note,) = [f for f in detail.structured_content["findings"] if f["rule"].startswith("mmparser.")]
    assert note["rule"] == "mmparser.not_run" and note["field"] == "mm_root", note
    assert detail.structured_content.get("ran_code_from") is None
    assert not canary.exists()


def test_a_server_that_runs_no_checkout_code_says_read_only_and_one_that_may_does_not(ws: Path) -> None:
    """The annotation is honest in each configuration: without a trusted checkout validate_configs only reads
    files; with one it may run that checkout's code (not read-only, and not promised harmless)."""
    assert _annotations(ws)["validate_configs"].read_only_hint is True
    (ws / "trusted").mkdir()
    trusting = _annotations(ws, trust_mm_roots=[ws / "trusted"])["validate_configs"]
    assert not trusting.read_only_hint and trusting.destructive_hint is not False


def test_a_trusted_checkout_runs_and_the_answer_says_code_from_it_was_run(ws: Path) -> None:
    checkout, canary = _planted(ws)
    args = {"paths": ["job"], "mm_root": "downloads/MindSpeed-MM", "detail": True}
    result = _call(ws, "validate_configs", args, trust_mm_roots=[ws / "downloads"])
    text = _text(result)
    assert canary.exists(), "the trusted checkout's parser was not run"
    assert f"code from {checkout} was run" in text, text
    assert result.structured_content["ran_code_from"] == str(checkout)


def test_trust_in_another_folder_does_not_cover_the_named_checkout(ws: Path) -> None:
    _, canary = _planted(ws)
    (ws / "trusted").mkdir()
    text = _text(
        _call(
            ws,
            "validate_configs",
            {"paths": ["job"], "mm_root": "downloads/MindSpeed-MM"},
            trust_mm_roots=[ws / "trusted"],
        )
    )
    assert not canary.exists() and "not run" in text, text


def test_the_cli_is_the_operator_it_runs_the_checkout_and_says_so(ws: Path) -> None:
    checkout, canary = _planted(ws)
    env = {**os.environ, "MM_AGENT_STATE_DIR": str(ws.parent / "state")}
    done = subprocess.run(
        [sys.executable, "-m", "mm_agent", "validate", "job", "--mm-root", str(checkout)],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert canary.exists()
    assert f"code from {checkout} was run" in " ".join(done.stdout.split()), done.stdout


# ---------------------------------------------------------------------------------------------------------
# check_environment(python=<workspace venv>): no .pth line runs


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    return next((where / "lib").glob("python3*/site-packages"))


def test_a_workspace_venvs_pth_file_is_not_executed_by_check_environment(ws: Path) -> None:
    """The venv's site-packages holds an `import` .pth line that writes a canary, next to a distribution that
    the checks still see (its site-packages is still on the probe's path)."""
    canary = ws.parent / "canary-pth"
    site = _venv(ws / "venv")
    (site / "evil.pth").write_text(f"import os; open({str(canary)!r}, 'w').write('ran')\n", encoding="utf-8")
    info = site / "torch-2.7.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.7.1\n", encoding="utf-8")
    args = {"python": "venv/bin/python", "checks": ["python_version", "torch_version"], "detail": True}
    result = _call(ws, "check_environment", args)
    assert not canary.exists(), "the probe ran the venv's .pth import line"
    report = DoctorReport.model_validate(result.structured_content)
    checks = {c.id: c for c in report.checks}
    assert checks["python_version"].status in {"ok", "warn"}, checks["python_version"]  # 3.10 is MM's
    assert "2.7.1" in checks["torch_version"].summary, checks["torch_version"]  # site-packages was read


def test_the_isolated_probe_still_finds_what_site_would_put_on_the_path(ws: Path, tmp_path: Path) -> None:
    """What `site` would have added, without its code: a .pth path line (an older editable install), a
    setuptools editable finder's MAPPING (read as data: the finder module writes a canary if imported), and
    $PYTHONPATH; and mm-agent in the interpreter running this test (an editable install is a finder .pth)."""
    from mm_agent.contained import Scope
    from mm_agent.doctor.probes import run_env_probe

    canary = ws.parent / "canary-finder"
    site = _venv(ws / "venv")
    old_style = ws / "src" / "MindSpeed"
    (old_style / "mindspeed").mkdir(parents=True)
    (old_style / "mindspeed" / "__init__.py").write_text("", encoding="utf-8")
    (site / "easy-install.pth").write_text(f"# editable\n{old_style}\n", encoding="utf-8")
    mapped = ws / "src" / "MindSpeed-MM" / "mindspeed_mm"
    mapped.mkdir(parents=True)
    (mapped / "__init__.py").write_text("", encoding="utf-8")
    finder = "__editable___mindspeed_mm_2_1_0_finder"
    (site / f"{finder}.py").write_text(
        f"open({str(canary)!r}, 'w').write('ran')\nMAPPING: dict[str, str] = {{'mindspeed_mm': {str(mapped)!r}}}\n",
        encoding="utf-8",
    )
    (site / "__editable__.mindspeed_mm-2.1.0.pth").write_text(
        f"import {finder}; {finder}.install()\n", encoding="utf-8"
    )
    extra = tmp_path / "pythonpath"
    (extra / "megatron").mkdir(parents=True)
    (extra / "megatron" / "__init__.py").write_text("", encoding="utf-8")
    request = {"modules": ["mindspeed", "mindspeed_mm", "megatron"]}
    env = {**os.environ, "PYTHONPATH": str(extra)}
    probe = run_env_probe(str(ws / "venv" / "bin" / "python"), request, env=env, timeout_s=60, scope=Scope())
    assert not canary.exists(), "the editable finder module was imported"
    found = {name: spec.origin if spec else None for name, spec in probe.modules.items()}
    assert found == {
        "mindspeed": str(old_style / "mindspeed" / "__init__.py"),
        "mindspeed_mm": str(mapped / "__init__.py"),
        "megatron": str(extra / "megatron" / "__init__.py"),
    }
    assert probe.prefix == str(ws / "venv")  # as site.venv() sets it
    import mm_agent

    own = run_env_probe(
        sys.executable, {"modules": ["mm_agent"]}, env=os.environ, timeout_s=60, scope=Scope()
    )
    spec = own.modules["mm_agent"]  # this test's interpreter: mm-agent installed (editable: a finder .pth)
    assert spec is not None and spec.origin == mm_agent.__file__, spec
