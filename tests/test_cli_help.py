"""The CLI for people (issue 14, item 8): every flag has help, and `mm-agent jobs` never cuts a run id."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from mm_agent.cli import build_parser, main
from mm_agent.jobspec import JobSpec
from mm_agent.runs import start_run, wait_run


def _walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    """(command, action) for every action of the parser and its subparsers (aliases once), -h excluded."""
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            found.extend((path, choice) for choice in action._choices_actions)  # the line in `mm-agent -h`
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.extend(_walk(sub, f"{path} {name}"))
            continue
        found.append((path, action))
    return found


def test_every_flag_and_command_has_help() -> None:
    actions = _walk(build_parser(), "mm-agent")
    commands = {path for path, _ in actions}
    assert len(commands) >= 15 and "mm-agent render" in commands and "mm-agent serve" in commands
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in actions
        if a.help is argparse.SUPPRESS or not (a.help or "").strip()
    ]
    assert not missing, f"{len(missing)} of {len(actions)} arguments have no help: {missing}"


def test_render_flags_are_the_jobspec_fields_each_with_help() -> None:
    """A JobSpec field added later gets a flag; it must come with a description (or CLI help)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    render = sub.choices["render"]
    by_dest = {a.dest: a for a in render._actions}
    for name in JobSpec.model_fields:
        assert name in by_dest, f"JobSpec.{name} has no `mm-agent render` flag"
        assert (by_dest[name].help or "").strip(), f"--{name.replace('_', '-')} has no help"


class _Req(BaseModel):
    note: str = "cli help test"


WORKER = "import json, pathlib, sys; pathlib.Path(sys.argv[1], 'report.json').write_text(json.dumps({'status': 'ok'}))"


@pytest.fixture
def two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two real finished runs (a worker that reports and exits) in a private state dir."""
    monkeypatch.setenv("MM_AGENT_STATE_DIR", str(tmp_path / "state"))
    ids = []
    for kind in ("convert", "train"):
        info = start_run(kind, [sys.executable, "-c", WORKER], _Req())
        assert wait_run(info.run_id).state == "succeeded"
        ids.append(info.run_id)
    return ids


@pytest.mark.parametrize("columns", [30, 60, 100, 200])
def test_jobs_never_cuts_a_run_id(
    two_runs: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any("…" in line for line in lines), lines
    for run_id in two_runs:
        # whole on one line, so it can be copied into the next command
        assert any(run_id in line for line in lines), (columns, run_id, lines)
    assert sum("succeeded" in line for line in lines) == 2, lines  # the state is not cut either
    assert main(["jobs", "--json"]) == 0
    assert {j["run_id"] for j in json.loads(capsys.readouterr().out)["jobs"]} == set(two_runs)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_serve_loads_only_its_own_command() -> None:
    """An MCP host starts `mm-agent serve` for every session (issue 29, latency): it must not import the other
    subcommands (each pulls in its part of the core to build its options), yet parse and help exactly as the
    whole command line does."""
    probe = (
        "import sys; from mm_agent.cli import build_parser; build_parser('serve'); "
        "print(sorted(m for m in sys.modules if m.startswith('mm_agent.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["['mm_agent.cli.serve']"], done.stdout
    full, only = build_parser(), build_parser("serve")
    assert _subparser(only, "serve").format_help() == _subparser(full, "serve").format_help()
    argv = [
        "serve",
        "--workspace",
        "/tmp",
        "--allow-path",
        "/data",
        "--tool-timeout",
        "5",
        "--transport",
        "http",
    ]
    assert vars(only.parse_args(argv)) == vars(full.parse_args(argv))


def test_serve_leaves_the_collector_on(tmp_path: Path) -> None:
    """`serve` holds the cyclic garbage collector off while the server is built (a quicker start); a refused
    start must not leave it off in the calling process."""
    import gc

    assert gc.isenabled()
    assert main(["serve", "--workspace", str(tmp_path / "missing")]) == 2
    assert gc.isenabled()
