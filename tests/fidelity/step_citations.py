"""Each model's steps data (`mm_agent/registry/data/steps/`), judged by the READMEs it cites, at every version.

A citation names a README (or doc) of the MindSpeed-MM tree, a heading and a short quote. `check(...)` reads
that file at a version, splits it into sections by its Markdown headings (a `#` line inside a fenced code
block is code, not a heading), and looks for the quote, whitespace-insensitive, in a section with that
heading (the section runs to the next heading of the same or a higher level, so it holds its subsections).
Besides the quote, what a step names must be in that tree: the stock scripts and files it runs or edits, the
repo of a download (its name is in the cited section), the converter method of a conversion (named by the
README). `rows(upstream)` is the report's column "steps cited": per (model, version), how many of the steps
that apply there are cited and re-found, or which step upstream cannot do.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from mm_agent.jobspec import task_repo
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry, version_key
from mm_agent.registry.steps import ModelSteps, Step, all_steps, readme_of
from tests.fidelity.report_cell import Cell

from .conftest import MMTrees

REPORT_VERSIONS = ("26.0.0", "26.1.0")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_ANCHOR = re.compile(r"<a\s[^>]*>\s*</a>")
_FILE_WORD = re.compile(r"^(examples|mindspeed_mm|checkpoint|docs)/[A-Za-z0-9_./{}-]+$")


def squash(text: str) -> str:
    return " ".join(text.split())


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, section text) for every heading outside code blocks; a section holds its subsections."""
    lines = text.splitlines()
    heads: list[tuple[int, int, str]] = []  # (line index, level, heading)
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:  # an HTML anchor in a heading (`## 1.1 x <a id="..."></a>`) is no part of its text
            heads.append((i, len(m.group(1)), _ANCHOR.sub("", m.group(2)).strip()))
    out = []
    for n, (start, level, heading) in enumerate(heads):
        end = next((s for s, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        out.append((heading, "\n".join(lines[start + 1 : end])))
    return out


def versions_of(entry: ModelEntry, table: ModelSteps, step: Step) -> list[str]:
    """The registry versions a step claims: its range within the file's and the model's, where one of the
    tasks (and sizes) it is for exists."""
    rng = step.versions or entry.versions
    tasks = [
        t
        for t in entry.tasks
        if (step.tasks is None or t.id in step.tasks)
        and (step.backends is None or t.backend in step.backends)
    ]
    sizes = [s for s in entry.sizes if step.sizes is None or s.id in step.sizes]
    return [
        v
        for v in get_registry().versions.ids
        if rng.contains(v)
        and table.versions.contains(v)
        and entry.versions.contains(v)
        and any(t.versions.contains(v) for t in tasks)
        and any(s.versions.contains(v) for s in sizes)
    ]


def _repos(entry: ModelEntry, step: Step) -> set[str]:
    """The Hugging Face repos a `{hf_id}` download stands for (each size's repo of each of its tasks)."""
    out: set[str] = set()
    for task in entry.tasks:
        if step.tasks is not None and task.id not in step.tasks:
            continue
        for size in entry.sizes:
            if step.sizes is not None and size.id not in step.sizes:
                continue
            if task.sizes is not None and size.id not in task.sizes:
                continue
            repo = task_repo(size.hf_ids, task.weights_of or task.id)
            if repo:
                out.add(repo)
    return out


def _named_files(entry: ModelEntry, step: Step, version: str) -> list[str]:
    """The stock files a step runs or edits, with `{size}`/`{task}`/`{adapts}` filled for each (task, size) it
    is for."""
    words = list(step.run or []) if step.cwd is None else []  # (under cwd: a checkout of another project)
    words += [e.split(":", 1)[0].strip() for e in step.edit or []]
    words = [w for w in words if _FILE_WORD.match(w) and "<" not in w]
    out: set[str] = set()
    for task in entry.tasks:
        if (step.tasks is not None and task.id not in step.tasks) or not task.versions.contains(version):
            continue
        if step.backends is not None and task.backend not in step.backends:
            continue
        # a LoRA once per model it adapts (`{adapts}`: its weights_of, then each of also_adapts at its sizes)
        for variant in [task, *(v for v in map(task.adapting, task.adapted()[1:]) if v is not None)]:
            adapts = variant.weights_of or task.id
            for size in entry.sizes:
                if (step.sizes is not None and size.id not in step.sizes) or not size.versions.contains(
                    version
                ):
                    continue
                if variant.sizes is not None and size.id not in variant.sizes:
                    continue
                out.update(
                    w.replace("{size}", size.id).replace("{task}", task.id).replace("{adapts}", adapts)
                    for w in words
                )
    return sorted(w for w in out if "{" not in w)


def check(entry: ModelEntry, step: Step, tree: Path, version: str) -> list[str]:
    """What the tree at one version says against this step (empty: the citation holds)."""
    problems: list[str] = []
    for rel in _named_files(entry, step, version):
        if not (tree / rel).exists():
            problems.append(f"names {rel}, which this tree lacks")
    if step.cite is None:
        return problems
    rel = readme_of(entry, step.cite)
    path = tree / rel
    if not path.is_file():
        return [*problems, f"cites {rel}, which this tree lacks"]
    text = path.read_text(encoding="utf-8")
    mine = [body for heading, body in sections(text) if heading == step.cite.heading]
    if not mine:
        return [*problems, f"{rel} has no heading {step.cite.heading!r}"]
    if not any(squash(step.cite.quote) in squash(body) for body in mine):
        problems.append(f"{rel} § {step.cite.heading} does not say {step.cite.quote!r}")
    cited = squash(" ".join(mine)).lower()
    if step.download is not None and step.download.repo is not None:
        repos = _repos(entry, step) if step.download.repo == "{hf_id}" else {step.download.repo}
        # a README may name a family with a wildcard (`Qwen3-VL-*B-Instruct`): the repo's name then matches it
        wild = [w.lower() for w in re.findall(r"[A-Za-z0-9_.\-]*\*[A-Za-z0-9_.\-*]*", cited)]
        for repo in sorted(repos):
            name = repo.rsplit("/", 1)[-1].lower()
            if name not in cited and not any(fnmatchcase(name, w) for w in wild if len(w) > 3):
                problems.append(f"{rel} § {step.cite.heading} does not name the repo {repo}")
    if step.convert is not None and step.differs is None and step.convert.method not in text:
        problems.append(f"{rel} never names the converter method {step.convert.method}")
    return problems


@dataclass(frozen=True)
class Finding:
    model: str
    step: str
    version: str
    problem: str

    def __str__(self) -> str:
        return f"{self.model} {self.step} @ {self.version}: {self.problem}"


def findings(upstream: Path) -> Iterator[Finding]:
    """Every problem of every step at every version it claims that has an upstream tree."""
    trees = MMTrees(upstream)
    reg = get_registry()
    for model, table in sorted(all_steps().items()):
        entry = reg.get(model)
        for step in table.steps:
            for version in versions_of(entry, table, step):
                tree = trees.version_dir(version)
                if tree is None:
                    continue
                for problem in check(entry, step, tree, version):
                    yield Finding(model, step.id, version, problem)


def count_checked(upstream: Path) -> int:
    """(step, version) pairs with a tree to judge them (the test's size, for its report)."""
    trees = MMTrees(upstream)
    reg = get_registry()
    return sum(
        1
        for model, table in all_steps().items()
        for step in table.steps
        for v in versions_of(reg.get(model), table, step)
        if trees.version_dir(v) is not None
    )


def cell(entry: ModelEntry, version: str, tree: Path | None) -> Cell:
    """Steps of every task and size of the model at `version`: cited and re-found, or unsupported."""
    table = all_steps().get(entry.id)
    if table is None or not table.versions.contains(version):
        return Cell(False, "no steps recorded")
    mine = [s for s in table.steps if version in versions_of(entry, table, s)]
    if not mine:
        return Cell(False, "no steps recorded")
    good = [s for s in mine if s.cite is not None and tree is not None and not check(entry, s, tree, version)]
    # A step no README gives (a script in the examples tree, a gap read from checkpoint/) says so and why in
    # data: it is accounted for, and the text says how many.
    uncited = [s for s in mine if s.cite is None and s.uncited]
    unsupported = [s for s in mine if s.unsupported is not None]
    counted = (
        f"{len(good)} of {len(mine)} cited" if len(good) < len(mine) else f"{len(mine)} steps, all cited"
    )
    if uncited:
        counted += f", {len(uncited)} not in any README (why: in data)"
    accounted = len({id(s) for s in [*good, *uncited, *unsupported]}) == len(mine)
    if unsupported:
        first = unsupported[0].unsupported
        assert first is not None
        more = f" (+{len(unsupported) - 1} more)" if len(unsupported) > 1 else ""
        # The other steps are still judged: a model with one step MindSpeed-MM cannot do (marked, with the
        # fix) is complete when the rest are cited; only a model with nothing else to judge is None.
        judged = len(unsupported) < len(mine)
        return Cell(
            accounted if judged else None,
            f"{counted}; unsupported in data: {unsupported[0].id}: {first.reason}{more}",
        )
    return Cell(accounted, counted)


def rows(upstream: Path) -> dict[tuple[str, str], Cell]:
    """The report column "steps cited" for every registry model at 26.0.0 and 26.1.0."""
    trees = MMTrees(upstream)
    out: dict[tuple[str, str], Cell] = {}
    for version in REPORT_VERSIONS:
        tree = trees.version_dir(version)
        for entry in sorted(get_registry().models.values(), key=lambda e: e.id):
            if entry.versions.contains(version):
                out[(entry.id, version)] = cell(entry, version, tree)
    return out


if __name__ == "__main__":  # python -m tests.fidelity.step_citations <upstream>
    table = rows(Path(sys.argv[1]))
    for (model, version), c in sorted(table.items(), key=lambda kv: (kv[0][0], version_key(kv[0][1]))):
        print(f"{model:18} {version:8} {c.text}")
    ok = sum(c.ok is True for c in table.values())
    print(f"{ok} of {len(table)} rows fully cited; {sum(c.ok is None for c in table.values())} unsupported")
