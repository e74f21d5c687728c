"""Every command mm-agent suggests names each path exactly, however the path is spelled (issue 25).

The hole: suggested commands put paths in as they were. A dataset folder named `ds;touch X;` made
prepare_dataset's "mm-agent dataset /.../ds;touch X; --model ..." run `touch` when pasted; validate's
`script.crlf` fix (`dos2unix FILE`), doctor's CRLF fix (`cd JOB && dos2unix ...`), validate's re-render,
estimate and dataset fixes, doctor's checkout fixes, the job manager's re-render fixes and render's weights
fix did the same. A diagnosis filled a log's text into its command (`pip index versions $(echo {requirement}
...)`), so a log line ran code in the shell the user pasted it into.

Each tool is called with hostile names (`;`, a space, `$(...)`, a quote, a leading `-`), each suggested
command is taken from its answer (a next step, or a `...` span of a fix), checked by `bash -n`, split with
shlex, and run by the real bash with a stand-in for every program it starts (they record their argv and
working directory): the path reaches the program as exactly one argument equal to the real path, no canary
file appears, and every `mm-agent` command parses with mm-agent's own CLI parser.
"""

from __future__ import annotations

import json
import re
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mm_agent.cli import build_parser
from mm_agent.cli.dataset import _request as dataset_request
from mm_agent.dataset import DatasetRequest, prepare_dataset
from mm_agent.diagnose import DiagnoseRequest, diagnose_errors
from mm_agent.doctor import check_environment
from mm_agent.doctor.models import DoctorRequest
from mm_agent.errors import MMAgentError
from mm_agent.jobfile import load_job_spec
from mm_agent.jobs.jobdir import load_stage
from mm_agent.jobs.resume import check_resume
from mm_agent.render import RenderRequest, render_job
from mm_agent.validate import ValidateRequest, validate_configs
from runtime.synth import write_mp4

CANARY = "CANARY"
NAMES = {
    "semicolons": "ds;touch CANARY;",
    "space": "a b",
    "substitution": "$(touch CANARY)",
    "quote": "it's",
    "dash": "-ds",
}
# Every program a suggested command starts; each is replaced by a stand-in that records its call.
PROGRAMS = (
    "mm-agent",
    "mm-convert",
    "dos2unix",
    "sed",
    "git",
    "pip",
    "rm",
    "cp",
    "bash",
    "python",
    "uname",
    "huggingface-cli",
    "kubectl",
    "sbatch",
    "ls",
)
STAND_IN = '#!/bin/bash\nprintf "%s\\0" "${0##*/}" "$PWD" "$@" > "$(mktemp "$MM_CALLS/call.XXXXXX")"\n'
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")  # `<new dir>`, `<node-0 ip>`: the user fills these in


@dataclass
class Call:
    program: str
    cwd: str
    args: list[str]


class Shell:
    """The real bash, with stand-ins for every program a suggestion may start, in a folder of its own."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "stand-ins"
        self.calls = tmp / "calls"
        self.cwd = tmp / "cwd"
        for folder in (self.bin, self.calls, self.cwd):
            folder.mkdir(parents=True, exist_ok=True)
        for clone in ("MindSpeed-MM", "MindSpeed", "Megatron-LM"):  # what a fix's `git clone` would make
            (self.cwd / clone).mkdir(exist_ok=True)
        for name in PROGRAMS:
            path = self.bin / name
            path.write_text(STAND_IN)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def run(self, command: str) -> list[Call]:
        """Run one suggested command (placeholders filled in); the calls it made. Fails on a canary."""
        command = PLACEHOLDER.sub("PLACEHOLDER", command)
        syntax = subprocess.run(["/bin/bash", "-n", "-c", command], capture_output=True, text=True)
        assert syntax.returncode == 0, (command, syntax.stderr)
        for old in self.calls.iterdir():
            old.unlink()
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "MM_CALLS": str(self.calls), "HOME": str(self.cwd)}
        subprocess.run(["/bin/bash", "-c", command], cwd=self.cwd, env=env, capture_output=True, text=True)
        canaries = [str(p) for p in self.tmp.parent.rglob(CANARY)]
        assert canaries == [], f"pasting {command!r} ran code: {canaries}"
        calls = []
        for path in sorted(self.calls.iterdir()):
            program, cwd, *args = path.read_text().split("\0")[:-1]
            if program == "mm-agent":
                try:
                    build_parser().parse_args(args)
                except SystemExit:
                    pytest.fail(f"mm-agent's CLI refuses the suggested {command!r}")
            calls.append(Call(program, cwd, args))
        return calls


@pytest.fixture
def shell(tmp_path: Path) -> Shell:
    return Shell(tmp_path / "shell")


def backticked(text: str) -> list[str]:
    """The commands of a fix: its `...` spans."""
    return re.findall(r"`([^`]+)`", text)


def commands(steps: list[str]) -> list[str]:
    return [s for s in steps if not s.lstrip().startswith("#")]


def words(command: str) -> list[str]:
    """The words a shell splits `command` into (placeholders filled in, comments dropped)."""
    return shlex.split(PLACEHOLDER.sub("PLACEHOLDER", command), comments=True)


def names(command: str, name: str) -> bool:
    return any(name in w for w in words(command))


def names_exactly(command: str, name: str, real: Path | list[str], calls: list[Call]) -> None:
    """Every word of `command` (as a shell splits it) and every argument a program got that holds `name`
    is one of the real paths (or a path under one), and at least one real path reached a program."""
    reals = [str(p) for p in (real if isinstance(real, list) else [real])]

    def ok(word: str) -> bool:
        return any(word == r or word.startswith(r + "/") for r in reals)

    split = words(command)
    assert all(ok(w) for w in split if name in w), (command, split)
    got = [a for c in calls for a in (c.cwd, *c.args) if name in a]
    assert got and all(ok(a) for a in got), (command, calls)


def _job(ws: Path, name: str, **fields: object) -> Path:
    render_job(RenderRequest(model="wan2.1", task="t2v", out_dir=name, confirm=True, **fields), root=ws)  # type: ignore[arg-type]
    return ws / name


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_prepare_dataset_next_steps(ws: Path, shell: Shell, name: str) -> None:
    folder = ws / name
    (folder / "images").mkdir(parents=True)
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "images" / "red.png")
    chat = [{"from": "human", "value": "<image>\nWhat color?"}, {"from": "gpt", "value": "Red."}]
    (folder / "chat.json").write_text(json.dumps([{"image": "images/red.png", "conversations": chat}]))
    dry = prepare_dataset(
        DatasetRequest(dir=name, model="qwen2.5vl", index=f"{name}/chat.json"), root=ws, workers=1
    )
    assert dry.accepted == 1 and len(dry.next_steps) == 2, dry.next_steps
    rerun, render = commands(dry.next_steps)
    calls = shell.run(rerun)
    names_exactly(rerun, name, folder, calls)
    [call] = calls
    args = build_parser().parse_args(call.args)
    assert (args.dir, args.index, args.yes) == (str(folder), str(folder / "chat.json"), True)
    # the suggested command is the same request, now written
    done = prepare_dataset(dataset_request(args), root=ws, workers=1)
    assert (done.accepted, done.status) == (1, "written")
    calls = shell.run(render)
    names_exactly(render, name, folder, calls)
    args = build_parser().parse_args(calls[0].args)
    assert (args.dataset_dir, args.dataset_file) == (str(folder), str(folder / "data.json"))


def test_prepare_dataset_rerun_keeps_the_jobs_limits(ws: Path, shell: Shell) -> None:
    """A clip folder checked against a job: the suggested `--yes` run names the job too, so it applies the
    same limits (without `--job` it checked against the stock 8-NPU job and rejected every clip)."""
    name = "clips;touch CANARY; a b"
    _job(ws, name + "-job", num_frames=17, max_height=240, max_width=416, npus_per_node=1)
    folder = ws / name
    folder.mkdir()
    for i in range(4):
        frames = np.zeros((17, 240, 416, 3), np.uint8)
        frames[..., 0] = 50 * i
        write_mp4(folder / f"c{i}.mp4", frames, 16)
        (folder / f"c{i}.txt").write_text(f"clip {i}")
    dry = prepare_dataset(DatasetRequest(dir=name, model="wan2.1", job_dir=name + "-job"), root=ws, workers=1)
    assert dry.accepted == 4, dry.rejected
    [rerun] = commands(dry.next_steps)
    calls = shell.run(rerun)
    names_exactly(rerun, name, [str(folder), str(ws / (name + "-job"))], calls)
    args = build_parser().parse_args(calls[0].args)
    assert (args.dir, args.job_dir) == (str(folder), str(ws / (name + "-job")))
    done = prepare_dataset(dataset_request(args), root=ws, workers=1)
    assert (done.accepted, done.status) == (4, "written")


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_crlf_fixes_of_validate_and_doctor(ws: Path, shell: Shell, name: str) -> None:
    job = _job(ws, name)
    script = job / f"{name}.sh"
    script.write_bytes(b"echo hi\r\n")
    pretrain = job / "pretrain.sh"
    pretrain.write_bytes(pretrain.read_bytes().replace(b"\n", b"\r\n"))
    report = validate_configs(ValidateRequest(paths=[name]), root=ws)
    crlf = {f.file: f.fix for f in report.findings if f.rule == "script.crlf"}
    assert set(crlf) == {str(script), str(pretrain)}, report.findings
    for path, fix in crlf.items():
        dos2unix, sed = backticked(fix)
        calls = shell.run(dos2unix)
        names_exactly(dos2unix, name, Path(path), calls)
        assert [(c.program, c.args) for c in calls] == [("dos2unix", [path])]
        calls = shell.run(sed)
        assert [(c.program, c.args) for c in calls] == [("sed", ["-i", "s/\\r$//", path])]

    doctor = check_environment(DoctorRequest(job=name, checks=["crlf_scripts"]), root=ws)
    [result] = doctor.checks
    assert result.status == "fail" and result.fix, result
    dos2unix, sed = backticked(result.fix)
    for suggested, program in ((dos2unix, "dos2unix"), (sed, "sed")):
        calls = shell.run(suggested)
        names_exactly(suggested, name, [str(job), f"./{name}.sh"], calls)
        [call] = calls
        assert call.program == program and call.cwd == str(job), call
        assert sorted(call.args[-2:]) == sorted([f"./{name}.sh", "./pretrain.sh"]), call


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"nnodes": 2, "master_addr": "127.0.0.1"},
        {"nnodes": 2, "master_addr": "10.0.0.1", "launcher": "pdsh"},
        {"runtime": "bundled", "npus_per_node": 2},
        {"task": "lora", "runtime": "bundled"},
    ],
    ids=["single", "multinode", "pdsh", "bundled", "lora"],
)
def test_render_next_steps(ws: Path, shell: Shell, name: str, fields: dict[str, object]) -> None:
    request = RenderRequest(**{"model": "wan2.1", "task": "t2v", "out_dir": name, **fields})  # type: ignore[arg-type]
    result = render_job(request, root=ws)
    job = ws / name
    steps = commands(result.next_steps)
    assert any(names(s, name) for s in steps), steps
    for step in steps:
        calls = shell.run(step)
        if names(step, name):
            names_exactly(step, name, job, calls)


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_validate_fixes_that_name_the_job_or_dataset(ws: Path, shell: Shell, name: str) -> None:
    job = _job(
        ws, name, size="14b", npus_per_node=1, nnodes=2, master_addr="127.0.0.1", dataset_dir=f"{name}/data"
    )
    (job / "data").mkdir()
    (job / "data" / "data.json").write_text(json.dumps([{"path": "a.mp4", "cap": "a clip"}]))
    (job / "data" / "a.mp4").write_bytes(b"0")
    report = validate_configs(ValidateRequest(paths=[name]), root=ws)
    fixes = {
        f.rule: f.message + " " + f.fix
        for f in report.findings
        if f.rule in ("multinode.master_addr", "dataset.metadata_missing", "estimate.over_budget")
    }
    assert set(fixes) == {"multinode.master_addr", "dataset.metadata_missing", "estimate.over_budget"}, [
        (f.rule, f.fix) for f in report.findings
    ]
    for rule, text in fixes.items():
        suggested = [c for c in backticked(text) if c.startswith("mm-agent")]
        assert suggested, (rule, text)
        for command in suggested:
            names_exactly(command, name, job, shell.run(command))


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_doctor_checkout_fixes(ws: Path, shell: Shell, name: str) -> None:
    root = ws / name
    missing = check_environment(DoctorRequest(mm_root=name, checks=["mm_checkout"]), root=ws)
    (root / "mindspeed_mm").mkdir(parents=True)
    present = check_environment(DoctorRequest(mm_root=name, checks=["megatron_tree", "mm_convert"]), root=ws)
    results = [*missing.checks, *present.checks]
    assert [r.status for r in results] == ["fail", "fail", "fail"], results
    for result in results:
        suggested = backticked(result.fix or "")
        assert any(names(c, name) for c in suggested), result.fix
        for command in suggested:
            calls = shell.run(command)
            if names(command, name):
                names_exactly(command, name, root, calls)


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_job_manager_and_weights_fixes(ws: Path, shell: Shell, name: str) -> None:
    job = _job(ws, name)
    (job / "pretrain.sh").unlink()
    with pytest.raises(MMAgentError) as gone:
        load_stage(job, "train", ws)
    [command] = backticked(gone.value.fix or "")
    names_exactly(command, name, job, shell.run(command))

    spec = load_job_spec(job / "job.yaml", ws)
    save = ws / "elsewhere"
    save.mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("10")
    with pytest.raises(MMAgentError) as taken:
        check_resume(job, spec, save, ws)
    [command] = backticked(taken.value.fix or "")
    names_exactly(command, name, job, shell.run(command))

    weights = ws / f"{name}-weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x")
    with pytest.raises(MMAgentError) as partial:
        render_job(RenderRequest(model="wan2.1", task="t2v", out_dir="j2", weights_dir=weights.name), root=ws)
    [command] = backticked(partial.value.fix or "")
    names_exactly(command, name, weights, shell.run(command))


@pytest.mark.parametrize(
    "requirement", ["x;touch${IFS}CANARY;#", "$(touch${IFS}CANARY)", "x'`touch${IFS}CANARY`'"]
)
def test_diagnosis_commands_quote_what_they_take_from_the_log(shell: Shell, requirement: str) -> None:
    log = f"ERROR: No matching distribution found for {requirement}\n"
    report = diagnose_errors(DiagnoseRequest(text=log))
    fixes = [fx for f in report.findings for fx in f.fixes if fx.command]
    assert fixes, report.findings
    for fix in fixes:
        calls = shell.run(fix.command or "")
        pip = [c.args for c in calls if c.program == "pip"]
        assert pip == [["index", "versions", requirement.split("=")[0]]], (fix.command, calls)
