"""No shell evaluation of any rendered value (issue 12, item 1).

The hole: templates wrote `MM_ROOT="${MM_ROOT:-'<mm_root>'}"`. shlex.quote's single quotes sat inside
double quotes, where they are plain characters, so `$(...)` and backquotes in `mm_root` ran when the script
ran (`render_job(mm_root="x$(id > FILE)")` then `bash finetune.sh` ran `id`) in every rendered MindSpeed-MM
script; `megatron_vlm/inference.sh` also put `load_path` in a `#` comment and the bundled pretrain.sh put
the weights path in echo arguments. Now a request value enters a script only as a single-quoted assignment
at the start of a line (`NAME='...'`) and is used as `"$NAME"`.

Guarded here, with real renders and real bash (stand-ins only for the launchers, which record their argv):
- every script of every registry model/task/backend (and of the bundled runtime) runs with every path field
  set to each hostile payload family, and nothing runs: no canary file, the paths reach argv literally;
- newline, CR, NUL, tab and other control characters in any string field are refused at the request model;
- statically, a line of a rendered .sh (and of install.sh) that holds a request value is a single-quoted
  assignment;
- install.sh runs its steps with hostile install paths and runs nothing of them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import mm_agent
from mm_agent.install.plan import InstallRequest, build_plan
from mm_agent.install.schema import Arch, OsFamily
from mm_agent.install.steps import EnvKind
from mm_agent.jobs.jobdir import load_stage
from mm_agent.jobspec import bundled_refusal
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate.shell import parse_script
from security.common import PATH_FIELDS

CANARY = "CANARY"
# One payload family per render: each breaks out of a different quoting mistake.
PAYLOADS = {
    "command-substitution": "$(touch CANARY)",
    "backquotes": "`touch CANARY`",
    "semicolons": ";touch CANARY;",
    "single-quote-breakout": "';touch CANARY;'",
    "double-quote-breakout": '";touch CANARY;"',
    "ifs-glob-backslash": "${IFS}touch${IFS}CANARY;*?[ab]\\",
}
# The registry's MindSpeed-MM scripts across every model/task/backend (issue 12 counted 90).
MIN_MINDSPEED_SCRIPTS = 90
LAUNCHERS = ("torchrun", "python", "python3", "accelerate", "deepspeed", "msrun", "npu-smi")
# Stand-in for a launcher (and for the stock script a custom job runs with `bash`): records its path, its
# arguments and the paths a custom job's wrapper exports to it (NUL-separated), and succeeds, logging one
# iteration line as Megatron does (the scripts grep the log for it afterwards, under pipefail).
STAND_IN = """#!/bin/bash
printf '%s\\0' "$0" "$@" "${JOB_DIR-}" "${LOAD_PATH-}" "${SAVE_PATH-}" "${DATASET_DIR-}" "${DATASET_FILE-}" \\
    > "$(mktemp "$ARGV_DIR/call.XXXXXX")"
echo " iteration 1/1 | elapsed time per iteration (ms): 1.0 | loss: 1.0"
"""
HANG_GUARD_S = 120
# bash itself, found before any stand-in is put first on PATH (an install step may run `bash`).
BASH = shutil.which("bash") or "/bin/bash"


@dataclass(frozen=True)
class Case:
    model: str
    task: str
    backend: str
    size: str | None
    version: str
    runtime: typing.Literal["mindspeed-mm", "bundled"]


def _cases() -> list[Case]:
    """One MindSpeed-MM job per registry (model, task, backend), and each bundled-runtime (model, task, size)."""
    reg = get_registry()
    cases: list[Case] = []
    for entry in reg.models.values():
        version = next(v for v in reversed(reg.versions.ids) if entry.versions.contains(v))
        for task in entry.tasks:
            cases.append(Case(entry.id, task.id, task.backend, None, version, "mindspeed-mm"))
            for size in entry.sizes:
                allowed = task.sizes is None or size.id in task.sizes
                if allowed and bundled_refusal(entry, task, size) is None:
                    cases.append(Case(entry.id, task.id, task.backend, size.id, version, "bundled"))
    return cases


CASES = _cases()


def _request(case: Case, out_dir: str, values: dict[str, str], *, confirm: bool) -> RenderRequest:
    return RenderRequest(
        model=case.model,
        task=case.task,  # type: ignore[arg-type]
        backend=case.backend,  # type: ignore[arg-type]
        size=case.size,
        mm_version=case.version,
        runtime=case.runtime,
        out_dir=out_dir,
        confirm=confirm,
        **values,  # type: ignore[arg-type]
    )


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _stand_ins(where: Path) -> Path:
    for name in LAUNCHERS:
        _executable(where / name, STAND_IN)
    return where


def _calls(argv_dir: Path) -> list[list[str]]:
    """The recorded calls: [program, arg, ...] each."""
    return [p.read_text(encoding="utf-8").split("\0")[:-1] for p in sorted(argv_dir.iterdir())]


def _canaries(tree: Path) -> list[Path]:
    return [p for p in tree.rglob(CANARY) if p.is_file()]


# ------------------------------------------------------------------------------------- fuzz: run them


def _hostile_values(index: int, payload: str) -> dict[str, str]:
    """Every path field of the request, relative (inside the workspace), with the payload as a component;
    `index` keeps each payload family's paths apart."""
    values = {field: f"{index}/{field}/{payload}" for field in PATH_FIELDS}
    values["dataset_file"] += "/data.json"
    return values


def _prepare_inputs(ws: Path, values: dict[str, str]) -> None:
    """What the scripts check before launching: the directories they cd into or test, a converted
    checkpoint's marker file (the InternVL code file is placed per case)."""
    for field, value in values.items():
        path = ws / value
        if field == "dataset_file":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("[]\n", encoding="utf-8")
        else:
            path.mkdir(parents=True, exist_ok=True)
    (ws / values["load_path"] / "latest_checkpointed_iteration.txt").write_text("release\n", encoding="utf-8")


def _script_env(script: Path, bin_dir: Path, argv_dir: Path, home: Path) -> dict[str, str]:
    """A clean environment (nothing overrides the rendered defaults) with the stand-ins first on PATH.
    The training script a wrapper checks for and the stock script it runs with `bash` are created where
    the script looks for them (read with the static parser), or named through the environment when the
    script has no default."""
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LC_ALL": "C",
        "ARGV_DIR": str(argv_dir),
        "PYTHON": str(bin_dir / "python"),
    }
    info = parse_script(str(script), script.read_text(encoding="utf-8"))
    if "TRAIN_SCRIPT" in info.env:
        target = info.env["TRAIN_SCRIPT"]
        assert target is not None, f"{script}: TRAIN_SCRIPT is not static"
        if not target:
            target = env["TRAIN_SCRIPT"] = str(home / "train.py")
        _executable(Path(target), STAND_IN)
    for delegate, _ in info.delegates:
        assert delegate is not None, f"{script}: the script it runs is not static"
        mm_root = info.env.get("MM_ROOT")
        assert mm_root, f"{script}: MM_ROOT is not static"
        _executable(Path(mm_root) / delegate, STAND_IN)  # the scripts run them from MM_ROOT
    return env


@pytest.mark.parametrize("family", list(PAYLOADS), ids=list(PAYLOADS))
def test_hostile_request_values_run_nothing_in_any_rendered_script(tmp_path: Path, family: str) -> None:
    """Render every registry job with every path field (and out_dir) holding the payload, run each .sh with
    bash to its launcher, and require: no canary, exit 0, and every hostile path in the launchers' argv
    carrying the payload literally (it reached argv unexpanded, unsplit, unglobbed)."""
    payload = PAYLOADS[family]
    index = list(PAYLOADS).index(family)
    ws, home, run_dir = tmp_path / "ws", tmp_path / "home", tmp_path / "run"
    for folder in (ws, home, run_dir):
        folder.mkdir()
    bin_dir = _stand_ins(tmp_path / "bin")
    values = _hostile_values(index, payload)
    _prepare_inputs(ws, values)
    hostile_prefix = str(ws / str(index))

    executed = {"mindspeed-mm": 0, "bundled": 0}
    for number, case in enumerate(CASES):
        out_dir = f"{index}/jobs/{number:03d}/{payload}"
        # InternVL's scripts check for its code file; any other model's weights folder holds no stray file
        # (a Wan job reads an existing, non-empty folder for its sizes)
        marker = ws / values["weights_dir"] / "modeling_internvl_chat.py"
        if case.model.startswith("internvl"):
            marker.write_text("", encoding="utf-8")
        else:
            marker.unlink(missing_ok=True)
        render_job(_request(case, out_dir, values, confirm=True), root=ws)
        scripts = sorted((ws / out_dir).rglob("*.sh"))
        assert scripts, case
        for script in scripts:
            argv_dir = tmp_path / "argv" / f"{number:03d}-{script.name}"
            argv_dir.mkdir(parents=True)
            env = _script_env(script, bin_dir, argv_dir, home)
            done = subprocess.run(
                [BASH, str(script)],
                cwd=run_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=HANG_GUARD_S,
            )
            where = f"{case} {script.relative_to(ws)}"
            # Where the payload would land (the script's cwd: where it started, MM_ROOT or the job dir);
            # the whole tree is searched at the end.
            landed = [
                d / CANARY for d in (run_dir, ws / values["mm_root"], ws / out_dir) if (d / CANARY).exists()
            ]
            assert not landed, f"{where} ran the payload: {done.stderr[-2000:]}"
            assert done.returncode == 0, f"{where} exited {done.returncode}: {done.stderr[-2000:]}"
            words = [word for call in _calls(argv_dir) for word in call]
            assert words, f"{where} reached no launcher"
            hostile = [word for word in words if hostile_prefix in word]
            assert hostile, f"{where}: no request path reached the launcher: {words}"
            mangled = [word for word in hostile if payload not in word]
            assert not mangled, f"{where}: paths changed on their way to argv: {mangled}"
            executed[case.runtime] += 1

    assert not _canaries(tmp_path)
    assert executed["mindspeed-mm"] >= MIN_MINDSPEED_SCRIPTS, executed
    assert executed["bundled"] >= 1, executed


# ----------------------------------------------------------------------- control characters refused

CONTROL = ["\n", "\r", "\x00", "\t", "\x0b", "\x1b", "\x7f", "\x85", "\u2028"]


def _string_fields(model: type[BaseModel]) -> list[str]:
    """Fields whose JSON schema admits a string (or a list of strings)."""

    def admits(schema: dict[str, typing.Any]) -> bool:
        if schema.get("type") == "string" or "enum" in schema:
            return True
        if schema.get("type") == "array":
            return admits(schema.get("items", {}))
        return any(admits(sub) for sub in schema.get("anyOf", []))

    props = model.model_json_schema()["properties"]
    return [name for name, schema in props.items() if admits(schema)]


def _refused_at(model: type[BaseModel], base: dict[str, typing.Any], field: str, char: str) -> None:
    good = base.get(field, "x")
    value: typing.Any = [f"{good[0]}{char}"] if isinstance(good, list) else f"{good}{char}tail"
    with pytest.raises(ValidationError) as err:
        model.model_validate({**base, field: value})
    fields = {e["loc"][0] for e in err.value.errors()}
    assert fields == {field}, err.value


RENDER_BASE: dict[str, typing.Any] = {
    "model": "qwen2.5vl",
    "task": "sft",
    "backend": "megatron",
    "size": "7b",
    "mm_version": "26.0.0",
    "runtime": "mindspeed-mm",
    "device": "npu",
    "master_addr": "localhost",
    "out_dir": "jobs/x",
}
INSTALL_BASE: dict[str, typing.Any] = {
    "model": "qwen2.5vl",
    "mm_version": "26.0.0",
    "arch": "x86_64",
    "os_family": "debian",
    "env": "venv",
    "python": "3.10",
    "also_models": ["wan2.1"],
    "steps": ["create-env"],
}


@pytest.mark.parametrize(
    ("model", "base"),
    [(RenderRequest, RENDER_BASE), (InstallRequest, INSTALL_BASE)],
    ids=["RenderRequest", "InstallRequest"],
)
def test_control_characters_in_any_string_field_are_refused_naming_it(
    model: type[BaseModel], base: dict[str, typing.Any]
) -> None:
    """A newline in load_path ended megatron_vlm/inference.sh's `#` comment and the next line ran; NUL,
    CR, tab and the other control characters are refused at the model too, naming the field."""
    model.model_validate(base)  # the base request itself is valid
    fields = _string_fields(model)
    assert {"model", "mm_root"} <= set(fields)
    if model is RenderRequest:
        assert set(PATH_FIELDS) | {"out_dir", "master_addr", "size", "mm_version"} <= set(fields)
    for field in fields:
        for char in CONTROL:
            _refused_at(model, base, field, char)


# ------------------------------------------------------------------- static: values only as assignments

# `NAME=<one shlex.quote word>` at the start of a line: single-quoted pieces, `"'"` (shlex.quote's escaped
# quote) and characters bash gives no meaning to; nothing else.
ASSIGNMENT = re.compile(r"""(?:export )?[A-Za-z_][A-Za-z0-9_]*=(?P<value>(?:'[^']*'|"'"|[\w@%+=:,./-])+)""")


def _sentinel(field: str) -> str:
    return f"SENT_{field}"


def _assignments_only(name: str, text: str) -> set[str]:
    """Check each line of `text` holding a sentinel; return the sentinels seen."""
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        found = set(re.findall(r"SENT_[a-z_]+", line))
        if not found:
            continue
        match = ASSIGNMENT.fullmatch(line)
        assert match, f"{name}:{number}: a request value outside a single-quoted assignment: {line}"
        (value,) = shlex.split(match["value"])
        assert found <= set(re.findall(r"SENT_[a-z_]+", value))
        seen |= found
    return seen


def test_request_values_enter_rendered_scripts_only_as_single_quoted_assignments(tmp_path: Path) -> None:
    """Each user field holds a unique sentinel (with characters that force quoting); in every rendered .sh
    of every registry job, a line holding one is `NAME='...'` (optionally exported): never a comment, an
    echo argument, a `${X:-...}` word or a double-quoted string."""
    values = {field: f"s/{field}/{_sentinel(field)} $x'q\"`" for field in PATH_FIELDS}
    values["master_addr"] = _sentinel("master_addr")  # its pattern allows no quoting characters
    seen: set[str] = set()
    for case in CASES:
        out_dir = f"s/out_dir/{_sentinel('out_dir')}/{case.model}-{case.task}-{case.backend}-{case.runtime}"
        result = render_job(_request(case, out_dir, values, confirm=False), root=tmp_path)
        for file in result.files:
            if file.path.endswith(".sh"):
                assert file.content is not None
                seen |= _assignments_only(f"{case} {file.path}", file.content)
    # The check is not vacuous: these fields do reach the scripts (the others only reach JSON/YAML).
    expected = {
        "mm_root",
        "weights_dir",
        "load_path",
        "dataset_dir",
        "dataset_file",
        "save_path",
        "master_addr",
    }
    assert {_sentinel(f) for f in expected} <= seen


INSTALL_PATHS = ("env_path", "mm_root", "src_dir")


def test_install_paths_enter_install_sh_only_as_single_quoted_assignments(tmp_path: Path) -> None:
    """The same for install.sh, over every model, arch, distro family and environment kind."""
    values = {field: f"{_sentinel(field)} $x'q\"`" for field in INSTALL_PATHS}
    reg = get_registry()
    seen: set[str] = set()
    for entry in reg.models.values():
        version = next(v for v in reversed(reg.versions.ids) if entry.versions.contains(v))
        for arch in typing.get_args(Arch):
            for family in typing.get_args(OsFamily):
                for env in typing.get_args(EnvKind):
                    req = InstallRequest(
                        model=entry.id, mm_version=version, arch=arch, os_family=family, env=env, **values
                    )
                    where = f"{entry.id} {version} {arch} {family} {env}"
                    seen |= _assignments_only(where, build_plan(req, root=tmp_path).script)
    assert seen == {_sentinel(f) for f in INSTALL_PATHS}


# ------------------------------------------------------------------------------ install.sh: run it


@pytest.mark.parametrize("family", list(PAYLOADS), ids=list(PAYLOADS))
def test_install_script_runs_nothing_from_hostile_paths(tmp_path: Path, family: str) -> None:
    """Run install.sh one step at a time with hostile env_path/mm_root/src_dir and every command a stand-in:
    no canary, and each path reaches the commands' argv literally."""
    payload = PAYLOADS[family]
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    values = {"env_path": f"{payload}/env", "mm_root": f"{payload}/MindSpeed-MM", "src_dir": f"{payload}/src"}
    plan = build_plan(
        InstallRequest(model="qwen2.5vl", arch="x86_64", os_family="debian", env="venv", **values), root=ws
    )
    script = tmp_path / "install.sh"
    script.write_text(plan.script, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    commands = {c.argv[0] for s in plan.steps for c in s.commands} | {
        c.argv[0] for s in plan.steps for c in s.verify
    }
    for command in commands:
        # Commands under a hostile path (the env's python) are stand-ins there; the rest on PATH.
        _executable(Path(command) if command.startswith("/") else bin_dir / command, STAND_IN)
    argv_dir = tmp_path / "argv"
    argv_dir.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C", "ARGV_DIR": str(argv_dir)}
    for step in plan.steps:
        if step.requires_root:
            continue
        done = subprocess.run(
            [BASH, str(script), step.id],
            cwd=home,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert not _canaries(tmp_path), f"step {step.id} ran the payload: {done.stderr[-2000:]}"
        assert "syntax error" not in done.stderr, done.stderr
    words = [word for call in _calls(argv_dir) for word in call]
    paths = {str(ws / v) for v in values.values()}
    for path in paths:
        assert any(word == path or word.startswith(path + "/") for word in words), (path, words)
    hostile = [word for word in words if str(ws) in word]
    assert hostile and all(payload in word for word in hostile), hostile


# ------------------------------------------------------------------ the interpreter bundled scripts run


def test_the_interpreter_path_in_bundled_scripts_is_never_evaluated(tmp_path: Path) -> None:
    """Bundled scripts default PYTHON to the interpreter that rendered them. Rendered by an interpreter
    whose path holds every payload, each script runs that interpreter by its literal path and nothing else.
    (The old unquoted `PYTHON=${PYTHON:-'...'}` honoured its single quotes, so this guards the form.)"""
    ws, home = tmp_path / "ws", tmp_path / "home"
    home.mkdir()
    hostile = ws.joinpath(*PAYLOADS.values())
    hostile.mkdir(parents=True)
    python = hostile / "python"
    python.symlink_to(sys.executable)
    repo = Path(mm_agent.__file__).resolve().parent.parent
    importable = os.pathsep.join([str(repo), *(p for p in sys.path if p.endswith("site-packages"))])
    render = (
        "from pathlib import Path; from mm_agent.render import RenderRequest, render_job; "
        "render_job(RenderRequest(model='wan2.1', task='t2v', runtime='bundled', out_dir='job', confirm=True), "
        "root=Path.cwd())"
    )
    subprocess.run(
        [str(python), "-c", render],
        cwd=ws,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": importable},
        check=True,
        timeout=HANG_GUARD_S,
    )
    python.unlink()
    _executable(python, STAND_IN)
    scripts = sorted((ws / "job").rglob("*.sh"))
    assert len(scripts) == 3
    for script in scripts:
        info = parse_script(str(script), script.read_text(encoding="utf-8"))
        assert info.env["PYTHON"] == str(python)
        load = Path(str(info.env["LOAD_PATH"])) if "LOAD_PATH" in info.env else None
        if load is not None:
            load.mkdir(parents=True, exist_ok=True)
            (load / "latest_checkpointed_iteration.txt").write_text("release\n", encoding="utf-8")
        argv_dir = tmp_path / "argv" / script.name
        argv_dir.mkdir(parents=True)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C", "ARGV_DIR": str(argv_dir)}
        done = subprocess.run(
            [BASH, str(script)], cwd=home, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
        )
        assert done.returncode == 0, done.stderr
        assert [call[0] for call in _calls(argv_dir)] == [str(python)]
    assert not _canaries(tmp_path)


# ---------------------------------------------------------------------- the job manager still reads them


def test_the_job_manager_still_sees_defaults_and_overridable_variables(tmp_path: Path) -> None:
    """The defaults moved to `NAME_DEFAULT='...'` with `NAME="${NAME:-$NAME_DEFAULT}"`: the static reader
    still resolves them, and the job manager still knows the environment may override them."""
    weird = "w $(touch CANARY) 'q'"
    render_job(
        RenderRequest(
            model="wan2.1", task="t2v", runtime="bundled", out_dir="job", master_addr="node-0", confirm=True
        ),
        root=tmp_path,
    )
    stage = load_stage(tmp_path / "job", "train", tmp_path)
    assert stage.vars["PYTHON"] == sys.executable and stage.vars["MASTER_ADDR"] == "node-0"
    assert {"PYTHON", "MASTER_ADDR", "MASTER_PORT", "NPUS_PER_NODE"} <= stage.overridable

    render_job(
        RenderRequest(model="qwen2.5vl", task="sft", mm_root=weird, out_dir="vlm", confirm=True),
        root=tmp_path,
    )
    stage = load_stage(tmp_path / "vlm", "train", tmp_path)
    assert stage.vars["MM_ROOT"] == str(tmp_path / weird)
    assert "MM_ROOT" in stage.overridable
    assert not _canaries(tmp_path)
