"""The converter commands mm-agent tells a user to run, judged by MindSpeed-MM's own converter CLI.

`offered(version)` collects every converter command mm-agent offers for every registry (model, task, backend,
size) at a MindSpeed-MM version: the commands of every stage of `pipeline.build_pipeline` (what `route_model`
and the model resources show) and the next steps of `render_job` (a dry run). A converter command is a
`mm-convert ...` or `python -c '...checkpoint.convert_cli...' ...` segment of a shell line (a `cd X && `
before it is the shell's business). `judge(tree, commands)` has that version's `checkpoint/convert_cli.py`
parse each one in a child process (`upstream_convert_cli.py`: jsonargparse over the real
`Commandable.subclasses`, nothing run). `rows(upstream)` is the report's column "commands accepted by their
tools": per (model, version), "k/n accepted" over the distinct commands offered for the model, or why there
is none.

Mentions of a converter that are not a command the judge can read (`mm-convert` inside another word, a
`python` line that is not `-c`) are collected as `unreadable`, so a new command shape cannot slip past.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mm_agent.errors import MMAgentError
from mm_agent.pipeline import build_pipeline, converter_gap
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry
from mm_agent.render import RenderRequest, render_job
from tests.fidelity.report_cell import Cell

from .conftest import MMTrees

VERSIONS = ("26.0.0", "26.1.0", "master")
CHILD = Path(__file__).with_name("upstream_convert_cli.py")
PYTHONS = ("python", "python3")
_SEPARATORS = ("&&", "||", ";", "|")


@dataclass(frozen=True)
class Use:
    """Where a command was offered: the job and the place (a pipeline stage, or render's next steps)."""

    model: str
    task: str
    backend: str
    size: str
    version: str
    where: str


@dataclass
class Command:
    """One distinct converter command (argv as the shell splits it) and every place it was offered."""

    argv: list[str]
    uses: list[Use] = field(default_factory=list)

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


@dataclass
class Offered:
    commands: dict[str, Command] = field(default_factory=dict)  # key: the command's text
    unreadable: list[tuple[Use, str]] = field(default_factory=list)
    jobs: int = 0
    refused: dict[str, str] = field(default_factory=dict)  # job -> why render_job refused it

    def add(self, use: Use, line: str) -> None:
        for argv in converter_argvs(line, lambda text: self.unreadable.append((use, text))):
            self.commands.setdefault(shlex.join(argv), Command(argv)).uses.append(use)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: str | None
    parsed: list[str] | None  # the subcommands the parser chose (class, method)
    checkpoint: str | None  # the checkpoint/__init__.py that judged


def converter_argvs(line: str, unreadable: object = None) -> list[list[str]]:
    """The converter commands in one shell line (`#` comments are none); other mentions go to `unreadable`."""
    if line.lstrip().startswith("#"):
        return []
    words = shlex.split(line, comments=True)
    segments: list[list[str]] = [[]]
    for word in words:
        if word in _SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(word)
    out = []
    for seg in segments:
        if seg[:1] == ["mm-convert"] or (
            seg[:1] and seg[0] in PYTHONS and seg[1:2] == ["-c"] and "checkpoint" in " ".join(seg[2:3])
        ):
            out.append(seg)
        elif any("mm-convert" in w or "convert_cli" in w for w in seg) and callable(unreadable):
            unreadable(shlex.join(seg))
    return out


def jobs(version: str) -> Iterable[tuple[ModelEntry, str, str, str]]:
    """(entry, task, backend, size) of every registry job at `version` (as tests/fidelity/test_parser.py)."""
    for entry in get_registry().models.values():
        if not entry.versions.contains(version):
            continue
        for task in entry.tasks:
            if not task.versions.contains(version):
                continue
            for size in entry.sizes:
                if (task.sizes is None or size.id in task.sizes) and size.versions.contains(version):
                    yield entry, task.id, task.backend, size.id


def offered(version: str, scratch: Path) -> Offered:
    """Every converter command mm-agent offers at `version`; render's paths are under `scratch`."""
    out = Offered()
    with contextlib.chdir(scratch):
        for entry, task_id, backend, size_id in jobs(version):
            out.jobs += 1
            task = next(t for t in entry.tasks if t.id == task_id and t.backend == backend)
            size = next(s for s in entry.sizes if s.id == size_id)
            name = f"{entry.id}-{task_id}-{backend}-{size_id}"
            for stage in build_pipeline(entry, task, size, version):
                for line in stage.commands:
                    out.add(Use(entry.id, task_id, backend, size_id, version, stage.stage), line)
            req = RenderRequest(
                model=entry.id,
                task=task_id,  # type: ignore[arg-type]
                backend=backend,  # type: ignore[arg-type]
                size=size_id,
                mm_version=version,
                out_dir=f"jobs/{name}-{version}",
            )
            try:
                steps = render_job(req, root=None).next_steps
            except MMAgentError as exc:
                out.refused[name] = exc.message
                continue
            for line in steps:
                out.add(Use(entry.id, task_id, backend, size_id, version, "next_steps"), line)
    return out


def judge(tree: Path, argvs: list[list[str]], scratch: Path) -> dict[str, Verdict]:
    """MindSpeed-MM `tree`'s converter CLI on each argv, in one child process (key: the command's text).

    The child runs in `scratch` and creates the folders the commands name there (relative ones, and absolute
    ones inside it): render the jobs with `scratch` as the current directory (`offered`) so theirs are too."""
    spec = scratch / "convert-cli-spec.json"
    spec.write_text(
        json.dumps({"root": str(tree), "scratch": str(scratch), "cases": argvs}), encoding="utf-8"
    )
    done = subprocess.run(
        [sys.executable, str(CHILD), str(spec)], capture_output=True, text=True, timeout=900, cwd=scratch
    )
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or len(lines) != len(argvs):
        raise RuntimeError(
            f"upstream_convert_cli.py on {tree} exited {done.returncode} after {len(lines)} of {len(argvs)} "
            f"cases:\n{done.stderr[-3000:]}"
        )
    return {
        shlex.join(line["argv"]): Verdict(line["ok"], line["error"], line["parsed"], line["checkpoint"])
        for line in lines
    }


# ----------------------------------------------------------------------------------------- stubs, read with ast


@functools.cache
def _classes(
    tree: Path,
) -> dict[str, tuple[list[str], dict[str, ast.FunctionDef | ast.AsyncFunctionDef], str]]:
    """Every class under checkpoint/: name -> (base names, own methods, file relative to the tree)."""
    out: dict[str, tuple[list[str], dict[str, ast.FunctionDef | ast.AsyncFunctionDef], str]] = {}
    for path in sorted((tree / "checkpoint").rglob("*.py")):
        module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                methods = {
                    n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
                out[node.name] = bases, methods, path.relative_to(tree).as_posix()
    return out


def find_method(
    tree: Path, class_name: str, method: str
) -> tuple[str, ast.FunctionDef | ast.AsyncFunctionDef] | None:
    """(file:line, definition) of `class_name.method` in `tree`'s checkpoint/, bases searched in order."""
    classes = _classes(tree)
    pending, seen = [class_name], set()
    while pending:
        name = pending.pop(0)
        if name in seen or name not in classes:
            continue
        seen.add(name)
        bases, methods, path = classes[name]
        if method in methods:
            return f"{path}:{methods[method].lineno}", methods[method]
        pending += bases
    return None


def _says_something(stmt: ast.stmt) -> bool:
    """A print or log call: what a stub may do before it raises."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    func = stmt.value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in ("print", "warn", "warning", "info", "error", "debug")


def stub_kind(tree: Path, class_name: str, method: str) -> str | None:
    """How `class_name.method` is a stub at this tree ("absent", "pass", "docstring only", "raise
    NotImplementedError"), or None when it has a body that does something."""
    found = find_method(tree, class_name, method)
    if found is None:
        return "absent"
    body = list(found[1].body)
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    if not body:
        return "docstring only"
    if all(
        isinstance(s, ast.Pass)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and s.value.value is ...)
        for s in body
    ):
        return "pass"
    last = body[-1]
    if isinstance(last, ast.Raise) and last.exc is not None and all(_says_something(s) for s in body[:-1]):
        exc = last.exc.func if isinstance(last.exc, ast.Call) else last.exc
        if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
            return "raise NotImplementedError"
    return None


def cells(version: str, found: Offered, verdicts: dict[str, Verdict]) -> dict[tuple[str, str], Cell]:
    """Per model at `version`: how many of the distinct commands offered for it the CLI accepts."""
    per_model: dict[str, list[str]] = {}
    for text, command in found.commands.items():
        for model in {u.model for u in command.uses}:
            per_model.setdefault(model, []).append(text)
    out: dict[tuple[str, str], Cell] = {}
    for entry in get_registry().models.values():
        if not entry.versions.contains(version):
            continue
        texts = per_model.get(entry.id, [])
        if texts:
            accepted = sum(verdicts[t].ok for t in texts)
            out[(entry.id, version)] = Cell(accepted == len(texts), f"{accepted}/{len(texts)} accepted")
            continue
        conv = entry.converter
        if conv is None:
            out[(entry.id, version)] = Cell(None, "no conversion step (trains from Hugging Face weights)")
            continue
        gap = converter_gap(conv, conv.to_training, version)
        why = gap.message if gap is not None else "no converter command offered"
        out[(entry.id, version)] = Cell(None, f"unsupported: {why}")
    return out


def rows(upstream: Path) -> dict[tuple[str, str], Cell]:
    """The report column "commands accepted by their tools", for every version with an upstream tree."""
    trees = MMTrees(upstream)
    out: dict[tuple[str, str], Cell] = {}
    with tempfile.TemporaryDirectory(prefix="convert-cli-") as tmp:
        for version in VERSIONS:
            tree = trees.version_dir(version)
            if tree is None:
                continue
            scratch = Path(tmp) / version
            scratch.mkdir()
            found = offered(version, scratch)
            argvs = [c.argv for c in found.commands.values()]
            out.update(cells(version, found, judge(tree, argvs, scratch)))
    return out


if __name__ == "__main__":  # a quick look: python -m tests.fidelity.convert_cli <upstream>
    for (model, version), cell in sorted(rows(Path(sys.argv[1])).items()):
        print(f"{model:18} {version:8} {cell.text}")
