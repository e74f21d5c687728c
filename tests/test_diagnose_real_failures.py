"""Diagnosis of failures produced for real (issue 14, item 7), and fixes that name something that works.

Every log here is real output, made in the test: the bundled runtime (`python -m runtime.train` under
torchrun, through the job manager) failing on a bad input and printing its own `error:`/`file:`/`field:`/
`fix:` lines; a real torchrun tearing down a worker that ignores SIGTERM, which ends in torchrun's own
"Unable to shutdown process N via 15, forcefully exiting via 9" and a `exitcode: -9 (SIGKILL)` summary
(torch/distributed/elastic/multiprocessing/api.py, `_close`; the failure path waits its fixed 30 s, so that
run starts first and runs while the other tests do); bash running scripts with CRLF line endings. Then
every fix in the failure catalog is checked against the thing it names: mm-agent commands against the
CLI's real argparse parser, torchrun commands against torch's, mm-convert lines against the registry's
converters, MCP tool names against the server's registered tools.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mm_agent.cli import build_parser
from mm_agent.diagnose import DiagnoseRequest, diagnose_errors, diagnose_text
from mm_agent.diagnose.catalog import get_catalog
from mm_agent.diagnose.schema import DiagnosisReport
from mm_agent.errors import MMAgentError
from mm_agent.jobs import StageRequest, start_stage, wait_job
from mm_agent.registry import get_registry
from mm_agent.render import RenderRequest, render_job
from mm_agent.server import build_server

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 120.0

# Rank 0 fails the way every bundled-runtime entry point does (runtime.errors.run_main around a main that
# raises RuntimeFailure); rank 1 ignores SIGTERM, so torchrun must SIGKILL it itself.
TEARDOWN_WORKER = """\
import os, signal, sys, time
if int(os.environ["RANK"]) != 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("rank 1 ignores SIGTERM", flush=True)
    time.sleep(120)
    sys.exit(0)
from runtime.errors import RuntimeFailure, run_main
def main(argv):
    time.sleep(1.0)  # rank 1 is up and ignoring SIGTERM by now
    raise RuntimeFailure("the feature file sora_features/a.pt is missing", file="sora_features/a.pt",
                         field="data_path", fix="re-run feature extraction: mm-agent extract job --yes")
run_main(main)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", autouse=True)
def teardown_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The torchrun whose teardown SIGKILLs a worker, and its log; started before this module's first test."""
    folder = tmp_path_factory.mktemp("teardown")
    (folder / "worker.py").write_text(TEARDOWN_WORKER)
    log = (folder / "torchrun.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    argv += ["--master_port", str(free_port()), str(folder / "worker.py")]
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    yield proc, folder / "torchrun.log"
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    log.close()


def by_id(report: DiagnosisReport) -> dict[str, object]:
    return {f.rule_id: f for f in report.findings}


def runtime_lines(log: str) -> dict[str, str]:
    """The first error/file/field/fix lines the program printed, read with a plain regex."""
    found: dict[str, str] = {}
    for key, value in re.findall(r"(?m)^(error|file|field|fix): (.+)$", log):
        if key == "error" and "error" in found:
            break
        found.setdefault(key, value.strip())
    return found


# ---------------------------------------------------------------------------------------------------------
# 1. the bundled runtime's own error is the root cause, in diagnose_errors and job_status


def make_bundled_job(ws: Path, name: str = "job") -> Path:
    """A bundled Wan2.1 job whose inputs exist but whose converted checkpoint holds no rank file."""
    render_job(
        RenderRequest(
            model="wan2.1",
            task="t2v",
            out_dir=name,
            npus_per_node=2,
            tp=1,
            pp=1,
            cp=1,
            master_port=free_port(),
            weights_dir="weights",
            load_path=f"{name}-ckpt",
            dataset_dir="dataset",
            runtime="bundled",
            confirm=True,
        ),
        root=ws,
    )
    job = ws / name
    (ws / "dataset").mkdir(exist_ok=True)
    (ws / "dataset" / "data.json").write_text("[]")
    (job / "sora_features").mkdir()
    (job / "sora_features" / "data.jsonl").write_text("")
    (ws / f"{name}-ckpt").mkdir()
    (ws / f"{name}-ckpt" / "latest_checkpointed_iteration.txt").write_text("release")
    return job


@pytest.mark.slow
def test_bundled_runtime_error_is_the_root_cause_of_a_failed_run(ws: Path) -> None:
    make_bundled_job(ws)
    launch = start_stage(StageRequest(job_dir="job", stage="train", confirm=True, stop_grace_s=5))
    assert launch.run_id is not None and launch.log is not None
    final = wait_job(launch.run_id, timeout_s=DEADLINE_S)
    log = Path(launch.log).read_text(errors="replace")
    said = runtime_lines(log)
    assert {"error", "fix"} <= said.keys(), f"the runtime printed no error/fix lines:\n{log[-3000:]}"
    assert final.state == "failed" and final.root_cause is not None
    cause = final.root_cause
    assert cause.rule_id == "reported_error" and cause.title == said["error"]
    assert [f.text for f in cause.fixes] == [said["fix"]]
    assert cause.evidence[0] == f"error: {said['error']}"
    assert f"file: {said['file']}" in cause.evidence  # the lines after the error travel with it

    report = diagnose_errors(DiagnoseRequest(run_id=launch.run_id))
    assert report.root_cause is not None and report.root_cause.rule_id == "reported_error"
    assert report.root_cause.title == said["error"] and report.root_cause.fixes[0].text == said["fix"]
    assert "torchrun_child_failed" not in {report.root_cause.rule_id, cause.rule_id}


def test_a_rendered_scripts_own_check_names_a_command_that_parses(tmp_path: Path) -> None:
    """The bundled script's input check prints error/fix itself; the fix is an mm-agent command that the
    real CLI parser accepts."""
    ws = tmp_path / "ws"
    ws.mkdir()
    job = make_bundled_job(ws)
    (ws / "job-ckpt" / "latest_checkpointed_iteration.txt").unlink()
    out = subprocess.run(
        ["bash", str(job / "pretrain.sh")], cwd=ws, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2, out.stderr
    said = runtime_lines(out.stderr)
    report = diagnose_text(out.stdout + out.stderr)
    assert report.root_cause is not None and report.root_cause.rule_id == "reported_error"
    assert report.root_cause.title == said["error"] and report.root_cause.fixes[0].text == said["fix"]
    argv = shlex.split(said["fix"].removeprefix("mm-agent "))
    assert build_parser().parse_args(argv).command == "convert"


def test_an_error_line_without_its_fix_is_not_a_reported_error() -> None:
    """git, pip and gcc print bare `error:` lines; only the error/fix shape is mm-agent's."""
    report = diagnose_text("error: pathspec 'v9' did not match any file(s) known to git\nfatal: exiting\n")
    assert "reported_error" not in by_id(report)
    followed = diagnose_text("error: pathspec 'v9' did not match\nsomething else\nfix: not this one\n")
    assert "reported_error" not in by_id(followed)


# ---------------------------------------------------------------------------------------------------------
# 3. CRLF line endings explain the `command not found` lines they cause


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def test_crlf_rendered_script_is_diagnosed_as_crlf(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    job = make_bundled_job(ws)
    script = job / "pretrain.sh"
    script.write_text(crlf(script.read_text()))
    out = subprocess.run(["bash", str(script)], cwd=ws, capture_output=True, timeout=60, check=False)
    assert out.returncode != 0 and b"\r" in out.stderr  # bash printed the name with its \r in it
    report = diagnose_text(out.stderr.decode())
    assert report.root_cause is not None and report.root_cause.rule_id == "crlf_script", report.findings


def test_crlf_outranks_the_command_not_found_lines_it_causes(tmp_path: Path) -> None:
    """A continuation line broken by its \\r runs `--nnodes` as a command, before any line shows the \\r."""
    script = tmp_path / "launch.sh"
    body = """\
        #!/bin/bash
        NPUS_PER_NODE=2
        echo "launching on $NPUS_PER_NODE NPUs"
        true --nproc_per_node "$NPUS_PER_NODE" \\
            --nnodes 1 \\
            --master_port 6000
        cd "$HOME"
    """
    script.write_text(crlf(textwrap.dedent(body)))
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, timeout=60, check=False)
    log = out.stdout.decode() + out.stderr.decode()
    assert "--nnodes: command not found" in log and "\\r'" in log, log
    assert log.index("--nnodes: command not found") < log.index("\\r'")  # the symptom comes first
    report = diagnose_text(log)
    found = by_id(report)
    assert report.root_cause is not None and report.root_cause.rule_id == "crlf_script"
    assert "command_not_found" in found  # still listed, as what the CRLF caused
    alone = diagnose_text(log.replace("cd: $'", "cd: '").replace("\\r'", "'"))  # no CRLF sign left
    assert alone.root_cause is not None and alone.root_cause.rule_id == "command_not_found"


# ---------------------------------------------------------------------------------------------------------
# 4. fixes that work: the catalog's commands against the real parsers and registries, and the two fixes
#    issue 14 found broken (--runtime bundled for Qwen, the TP=3 error without choices)


def concrete(command: str) -> str:
    """Placeholders (`<job dir>`, `<model>`) filled with a word, as a user would."""
    return re.sub(r"<[^<>]+>", "x", command)


def catalog_commands(program: str) -> list[tuple[str, str]]:
    """(rule id, command line) for every `program ...` a fix names: its command, or a `...` span of its text
    that gives arguments (a bare `mm-agent validate` in prose names the subcommand only)."""
    found: list[tuple[str, str]] = []
    for entry in get_catalog():
        for fix in entry.sig.fixes:
            spans = [s for s in re.findall(r"`([^`]+)`", fix.text) if len(s.split()) > 2]
            for span in spans + ([fix.command] if fix.command else []):
                for part in re.split(r"\s*(?:;|&&|\|\|?)\s*", span):
                    if part.startswith(f"{program} "):
                        found.append((entry.sig.id, part.split("  #")[0].strip()))
    return found


def test_every_mm_agent_command_in_a_fix_parses_with_the_cli_parser() -> None:
    commands = catalog_commands("mm-agent")
    assert len(commands) >= 40
    parser = build_parser()
    for rule, command in commands:
        argv = shlex.split(concrete(command))[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{rule}: `{command}` is not a valid mm-agent command line (exit {exc.code})")
    # prose mentions ("mm-agent diagnose on the whole log directory") name a real subcommand too
    names = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    for entry in get_catalog():
        for fix in entry.sig.fixes:
            for word in re.findall(r"\bmm-agent ([a-z_][\w-]*)", fix.text):
                assert word in names, f"{entry.sig.id}: 'mm-agent {word}' is no subcommand ({sorted(names)})"


def test_every_torchrun_and_mm_convert_command_in_a_fix_is_real() -> None:
    from torch.distributed.run import get_args_parser

    torchrun = catalog_commands("torchrun")
    assert torchrun
    for rule, command in torchrun:
        argv = shlex.split(command.replace("...", "train.py"))[1:]
        try:
            get_args_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{rule}: `{command}` is not a valid torchrun command line")
    converters = {
        m.converter.class_name: set(m.converter.methods)
        for m in get_registry().models.values()
        if m.converter is not None
    }
    convert = catalog_commands("mm-convert")
    assert len(convert) >= 5
    for rule, command in convert:
        _, cls, method, *_ = shlex.split(concrete(command))
        assert method in converters.get(cls, set()), f"{rule}: {cls} has no method {method!r}"


def test_every_mcp_tool_a_fix_names_is_registered(tmp_path: Path) -> None:
    tools = {t.name for t in anyio.run(build_server(tmp_path).list_tools)}
    named = [
        (entry.sig.id, name)
        for entry in get_catalog()
        for fix in entry.sig.fixes
        for name in re.findall(r"\bMCP tool (\w+)", fix.text)
    ]
    assert len(named) >= 4
    for rule, name in named:
        assert name in tools, f"{rule}: names MCP tool {name!r}; registered: {sorted(tools)}"
    for entry in get_catalog():  # the catalog cannot know the job's model: it must not offer this
        for fix in entry.sig.fixes:
            assert "--runtime bundled" not in f"{fix.text} {fix.command}", entry.sig.id


def render_error(ws: Path, **fields: object) -> MMAgentError:
    with pytest.raises(MMAgentError) as info:
        render_job(RenderRequest(out_dir="x", **fields), root=ws)  # type: ignore[arg-type]
    return info.value


@pytest.mark.parametrize(("model", "task"), [("wan2.1", "t2v"), ("qwen2.5vl", "sft")])
def test_tp_error_lists_choices_that_each_render(tmp_path: Path, model: str, task: str) -> None:
    size = "7b" if model == "qwen2.5vl" else None
    error = render_error(tmp_path, model=model, task=task, size=size, tp=3, npus_per_node=8)
    assert error.field == "tp/pp/cp" and error.fix is not None
    m = re.search(r"TP in \[([\d, ]+)\]", error.fix)
    assert m is not None, error.fix
    choices = [int(t) for t in m.group(1).split(",")]
    assert choices and 3 not in choices
    for tp in choices:  # a dry run: each named value passes render's own checks
        request = RenderRequest(out_dir="x", model=model, task=task, size=size, tp=tp, npus_per_node=8)
        render_job(request, root=tmp_path)
    if model == "qwen2.5vl":  # 8 divides 8 but not the 28 attention heads of the 7B LLM
        assert 8 not in choices and "llm_heads=28" in error.fix


def test_device_fix_offers_the_bundled_runtime_only_where_render_accepts_it(tmp_path: Path) -> None:
    qwen3 = render_error(tmp_path, model="qwen3vl", task="sft", device="cpu")
    assert qwen3.fix is not None and "--runtime bundled" not in qwen3.fix
    render_error(tmp_path, model="qwen3vl", task="sft", device="cpu", runtime="bundled")  # as render says
    for model, task in (("wan2.1", "t2v"), ("qwen2.5vl", "sft")):
        offered = render_error(tmp_path, model=model, task=task, device="cpu")
        assert offered.fix is not None and "--runtime bundled" in offered.fix
        render_job(
            RenderRequest(out_dir="x", model=model, task=task, device="cpu", runtime="bundled"), root=tmp_path
        )


@pytest.mark.parametrize(
    ("model", "task", "offered"),
    [("qwen3vl", "sft", False), ("qwen2.5vl", "sft", True), ("wan2.1", "t2v", True)],
)
def test_launch_offers_the_bundled_runtime_only_where_render_accepts_it(
    ws: Path, model: str, task: str, offered: bool
) -> None:
    render_job(
        RenderRequest(out_dir="job", model=model, task=task, mm_root="no-such-checkout", confirm=True),
        root=ws,
    )
    with pytest.raises(MMAgentError) as info:
        start_stage(StageRequest(job_dir="job", stage="train"))
    assert info.value.field == "MM_ROOT" and info.value.fix is not None
    assert ("--runtime bundled" in info.value.fix) is offered
    if offered:  # and what it offers renders
        render_job(RenderRequest(out_dir="job2", model=model, task=task, runtime="bundled"), root=ws)
    else:
        render_error(ws, model=model, task=task, runtime="bundled")


# ---------------------------------------------------------------------------------------------------------
# 2. torchrun's own teardown SIGKILL is a consequence, never a host OOM, never above the first failure
#    (last: the run started with the module has had its 30 s by now)


def test_torchrun_teardown_sigkill_is_a_consequence(
    teardown_run: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, log_path = teardown_run
    end = time.monotonic() + DEADLINE_S
    while proc.poll() is None:
        assert time.monotonic() < end, "torchrun did not finish"
        time.sleep(0.2)
    log = log_path.read_text(errors="replace")
    killed = re.search(
        r"Unable to shutdown process (\d+) via \S+, forcefully exiting via (?:Signals\.)?(?:9|SIGKILL)", log
    )
    assert killed is not None, f"torchrun did not SIGKILL the stubborn worker:\n{log[-3000:]}"
    assert re.search(rf"exitcode\s*:\s*-9 \(pid: {killed.group(1)}\)", log), log[-3000:]
    said = runtime_lines(log)

    report = diagnose_text(log)
    found = by_id(report)
    assert report.root_cause is not None and report.root_cause.rule_id == "reported_error"
    assert report.root_cause.title == said["error"] and report.root_cause.fixes[0].text == said["fix"]
    assert "killed_by_signal" not in found and "host_oom_killed" not in found
    teardown = report.findings[[f.rule_id for f in report.findings].index("torchrun_teardown_kill")]
    assert teardown.effect == "warning" and killed.group(1) in teardown.title
    assert any("-9" in e.text for e in teardown.evidence)  # the summary's SIGKILL line is counted here

    # without the runtime's lines, torchrun's summary (not the SIGKILL) is what is left to point at
    rest = "\n".join(line for line in log.splitlines() if not re.match(r"(error|file|field|fix): ", line))
    bare = diagnose_text(rest)
    assert bare.root_cause is not None and bare.root_cause.rule_id == "torchrun_child_failed"
    assert "killed_by_signal" not in by_id(bare)
    # the same -9 line with no teardown before it is still an outside kill
    outside = diagnose_text(rest.replace("forcefully exiting", "forcibly exiting"))
    assert outside.root_cause is not None and outside.root_cause.rule_id == "killed_by_signal"
