"""Registry paths and version ranges, judged by the MindSpeed-MM trees themselves, at every version.

For every registry model and every MindSpeed-MM version that has an upstream tree (2.1.0, 2.2.0, 2.3.0, 26.0.0,
26.1.0, master), each path the registry names exists in that version's tree whenever the registry says the model,
task, size or script is available there; each `versions` range (model, size, config file role, task, script,
feature extraction, converter class and method) is exactly the set of versions whose tree has its files; a converter
is defined under `checkpoint/` with its methods and is (or, with `cli_registered: false`, is not) loaded by
`checkpoint/__init__.py`, which is what `mm-convert` sees; every `examples/` directory maps to a model or to a
reasoned entry of `registry/data/unregistered_examples.yaml`; `root_entry_points` are exactly the root scripts.

The older trees (2.1.0-2.3.0) are partial: they hold only `examples/`, `checkpoint/`, `mindspeed_mm/tools/` and the
root entry scripts. A path outside those (e.g. `mindspeed_mm/fsdp/train/trainer.py`) cannot be judged there: such
(path, version) pairs are counted as unjudged and never taken as evidence either way.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mm_agent.registry import get_registry, load_unregistered_examples
from mm_agent.registry.schema import ModelEntry, VersionRange, version_key

from .conftest import MMTrees, upstream_root

# Registry version ids whose upstream tree the fixture knows, oldest first (master last).
TREE_VERSIONS = sorted(get_registry().versions.ids, key=version_key)
# What a partial tree (no `mindspeed_mm/__init__.py`) holds besides the root entry scripts.
PARTIAL_TREE_PREFIXES = ("examples/", "checkpoint/", "mindspeed_mm/tools/")
ALWAYS = VersionRange()


@functools.cache
def _trees() -> dict[str, Path]:
    root = upstream_root()
    if root is None:
        return {}
    trees = MMTrees(root)
    return {v: d for v in TREE_VERSIONS if (d := trees.version_dir(v)) is not None}


def _is_partial(tree: Path) -> bool:
    return not (tree / "mindspeed_mm" / "__init__.py").is_file()


def judgeable(tree: Path, rel: str) -> bool:
    """Whether the tree can say if `rel` exists (a partial tree only holds some folders)."""
    return not _is_partial(tree) or "/" not in rel.rstrip("/") or rel.startswith(PARTIAL_TREE_PREFIXES)


@functools.cache
def _parsed(tree: Path) -> dict[Path, ast.Module]:
    return {
        path: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for path in sorted((tree / "checkpoint").rglob("*.py"))
    }


@functools.cache
def _cli_classes(tree: Path) -> frozenset[str]:
    """Names of the classes defined in the modules `mm-convert` loads."""
    modules = _cli_modules(tree)
    parsed = _parsed(tree)
    return frozenset(
        node.name for path in modules for node in ast.walk(parsed[path]) if isinstance(node, ast.ClassDef)
    )


@functools.cache
def _converter_classes(tree: Path) -> dict[str, tuple[tuple[str, ...], frozenset[str]]]:
    """Every class under checkpoint/: name -> (base names, own method names), read with ast (never imported)."""
    classes: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}
    for module in _parsed(tree).values():
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef):
                bases = tuple(b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases)
                methods = frozenset(
                    n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                )
                classes[node.name] = bases, methods
    return classes


@functools.cache
def _cli_modules(tree: Path) -> frozenset[Path]:
    """checkpoint/ modules that `mm-convert` (checkpoint/convert_cli.py) loads: `checkpoint/__init__.py` and what
    it imports, transitively. A Converter subclass registers itself for the CLI only when its module is loaded."""
    seen: set[Path] = set()
    pending = [tree / "checkpoint" / "__init__.py"]
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for node in ast.walk(_parsed(tree)[path]):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[0] == "checkpoint":
                    base = tree.joinpath(*name.split("."))
                    pending += [base.with_suffix(".py"), base / "__init__.py"]
    return frozenset(seen)


def converter_methods(tree: Path, class_name: str) -> frozenset[str] | None:
    """Methods of a checkpoint/ class including inherited ones; None when the class is not defined."""
    classes = _converter_classes(tree)
    if class_name not in classes:
        return None
    seen: set[str] = set()
    methods: set[str] = set()
    pending = [class_name]
    while pending:
        name = pending.pop()
        if name in seen or name not in classes:
            continue
        seen.add(name)
        bases, own = classes[name]
        methods |= own
        pending.extend(bases)
    return frozenset(methods)


# --------------------------------------------------------------------------------------------- claims


@dataclass
class Claim:
    """Something versioned the registry names, with the files that define it.

    `own` is the range written on the thing itself, `outer` the ranges of what contains it (model, task): the thing
    is claimed at v when both contain v. It exists at v when every path exists (and, for a converter, the class
    defines the methods). Over the versions in `outer` whose tree can judge every path, claimed == exists.
    """

    where: str
    paths: list[str]
    own: VersionRange
    outer: list[VersionRange]
    converter: tuple[str, tuple[str, ...], bool] | None = None  # (class, methods, reachable by mm-convert)
    tight: bool = True  # False: existence only (a range shared with other things, e.g. a deps overlay)
    needles: list[tuple[str, str]] = field(default_factory=list)  # (path, text it must contain)

    def claimed(self, version: str) -> bool:
        return self.own.contains(version) and all(r.contains(version) for r in self.outer)

    def in_outer(self, version: str) -> bool:
        return all(r.contains(version) for r in self.outer)


def _range_text(rng: VersionRange) -> str:
    return f"since {rng.since}" + (f", until {rng.until}" if rng.until else "")


def claims_of(entry: ModelEntry) -> list[Claim]:
    m = entry.versions
    out = [Claim(f"{entry.id}: example_dir", [entry.example_dir], m, [])]
    for size in entry.sizes:
        where = f"{entry.id}: sizes[{size.id}]"
        ranged = size.config_file_versions
        files = sorted({path for role, path in size.config_files.items() if role not in ranged})
        out.append(Claim(f"{where}.config_files", files, size.versions, [m]))
        for role, rng in ranged.items():
            out.append(
                Claim(f"{where}.config_files[{role}]", [size.config_files[role]], rng, [m, size.versions])
            )
    for i, task in enumerate(entry.tasks):
        t = f"{entry.id}: tasks[{i}] ({task.id}, {task.backend})"
        tv = task.versions
        # A task is its stock launch script; without one, a model-specific entry script in examples/ stands in.
        own_script = task.example_script or (
            p if (p := task.entry_script.path).startswith("examples/") else None
        )
        claim = Claim(f"{t}.example_script", [own_script] if own_script else [], tv, [m])
        if task.readme_section is not None:
            readme = f"{entry.example_dir}/README.md"
            claim.paths.append(readme)
            claim.needles.append((readme, task.readme_section))
        out.append(claim)
        for j, other in enumerate(task.also_adapts):  # a LoRA's other stock example (Wan2.1 14b/i2v)
            out.append(Claim(f"{t}.also_adapts[{j}].example_script", [other.example_script], tv, [m]))
        out.append(Claim(f"{t}.entry_script", [task.entry_script.path], task.entry_script.versions, [m, tv]))
        if task.inference_script is not None:
            inf = task.inference_script
            out.append(Claim(f"{t}.inference_script", [inf.path], inf.versions, [m, tv]))
        if task.evaluation is not None:
            ev = task.evaluation.script
            out.append(Claim(f"{t}.evaluation.script", [ev.path], ev.versions, [m, tv]))
        if task.feature_extraction is not None:
            fe = task.feature_extraction
            out.append(Claim(f"{t}.feature_extraction", [fe.script, fe.example_dir], fe.versions, [m, tv]))
    for i, deps in enumerate(entry.deps):
        files = ([deps.requirements_file] if deps.requirements_file else []) + list(deps.scripts)
        if files:
            out.append(Claim(f"{entry.id}: deps[{i}] files", files, deps.versions, [m], tight=False))
    # the model's converter, and a task's own (Qwen3-VL's fsdp2-native GenericDCPConverter), within that task
    owners = [(entry.converter, f"{entry.id}: converter", [m])]
    owners += [
        (t.converter, f"{entry.id}: {t.id}/{t.backend} converter", [m, t.versions]) for t in entry.tasks
    ]
    for conv, label, within in owners:
        if conv is None:
            continue
        name = conv.class_name
        always = tuple(x for x in conv.methods if x not in conv.method_versions)
        cli = conv.cli_registered
        out.append(Claim(f"{label} {name}", [], conv.versions, within, converter=(name, always, cli)))
        for method, rng in conv.method_versions.items():
            where = f"{label} {name}.method_versions[{method}]"
            out.append(Claim(where, [], rng, [*within, conv.versions], converter=(name, (method,), cli)))
    return out


@dataclass
class Verdict:
    checked: int = 0  # (path, version) pairs judged
    unjudged: list[str] = field(default_factory=list)  # (path, version) pairs a partial tree cannot judge
    problems: list[str] = field(default_factory=list)


def judge(claims: Iterable[Claim], trees: dict[str, Path]) -> Verdict:
    verdict = Verdict()
    for claim in claims:
        claimed: list[str] = []
        existing: list[str] = []
        for v, tree in trees.items():
            if not claim.in_outer(v):
                continue
            blind = [p for p in claim.paths if not judgeable(tree, p)]
            if blind:
                verdict.unjudged += [f"{claim.where} {p} @ {v}" for p in blind]
                continue
            missing = [p for p in claim.paths if not (tree / p).exists()]
            verdict.checked += len(claim.paths)
            for path, needle in claim.needles:
                verdict.checked += 1
                if path not in missing and needle not in (tree / path).read_text(encoding="utf-8"):
                    missing.append(f"{path} section {needle!r}")
            if claim.converter is not None:
                class_name, wanted, via_cli = claim.converter
                verdict.checked += 1
                have = converter_methods(tree, class_name)
                if have is None:
                    missing.append(f"checkpoint/: class {class_name}")
                elif (class_name in _cli_classes(tree)) != via_cli:
                    missing.append(
                        f"checkpoint/: {class_name} with cli_registered: {via_cli} (checkpoint/__init__.py "
                        f"{'does not load' if via_cli else 'loads'} its module for mm-convert)"
                    )
                elif lacking := sorted(set(wanted) - have):
                    missing.append(f"checkpoint/: {class_name} methods {lacking}")
            if claim.claimed(v):
                claimed.append(v)
                verdict.problems += [f"{claim.where}: {p} does not exist at {v}" for p in missing]
            if not missing:
                existing.append(v)
        if not claim.tight or not (claim.paths or claim.converter):
            continue
        extra = [v for v in existing if v not in claimed]
        if extra:
            verdict.problems.append(
                f"{claim.where}: {claim.paths or claim.converter} exist(s) at {extra} too, outside the registry's "
                f"range ({_range_text(claim.own)}); first/last version with them: {existing[0]}/{existing[-1]}"
            )
        if existing and existing != TREE_VERSIONS[TREE_VERSIONS.index(existing[0]) :][: len(existing)]:
            verdict.problems.append(f"{claim.where}: {claim.paths} exist at {existing} only (a gap)")
    return verdict


# ---------------------------------------------------------------------------------------------- tests

MODEL_IDS = sorted(get_registry().models)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_registry_paths_exist_at_every_claimed_version(model_id: str, mm_tree: MMTrees) -> None:
    trees = _trees()
    assert set(trees) == set(TREE_VERSIONS), f"upstream trees missing for {set(TREE_VERSIONS) - set(trees)}"
    verdict = judge(claims_of(get_registry().get(model_id)), trees)
    assert verdict.checked, f"{model_id}: no path judged"
    assert not verdict.problems, "\n".join(verdict.problems)


@pytest.mark.parametrize("version", TREE_VERSIONS)
def test_root_entry_points_are_the_root_scripts(version: str, mm_tree: MMTrees) -> None:
    tree = _trees()[version]
    info = get_registry().versions.get(version)
    assert info is not None
    scripts = sorted(p.name for p in tree.glob("*.py"))
    assert sorted(info.root_entry_points) == scripts, (
        f"versions.yaml {version}.root_entry_points: missing {sorted(set(scripts) - set(info.root_entry_points))}, "
        f"not in the tree {sorted(set(info.root_entry_points) - set(scripts))}"
    )


def _example_dirs(tree: Path, containers: set[str]) -> list[str]:
    """examples/<dir> of a tree, descending one level into container folders (diffusers/, mcore/, ...)."""
    out = []
    for top in sorted(p for p in (tree / "examples").iterdir() if p.is_dir()):
        rel = f"examples/{top.name}"
        if rel in containers:
            out += [f"{rel}/{sub.name}" for sub in sorted(top.iterdir()) if sub.is_dir()]
        else:
            out.append(rel)
    return out


@pytest.mark.parametrize("version", TREE_VERSIONS)
def test_every_examples_dir_maps_to_a_model(version: str, mm_tree: MMTrees) -> None:
    tree = _trees()[version]
    registry = get_registry()
    by_dir = {e.example_dir: e for e in registry.models.values()}
    unregistered = {u.dir: u for u in load_unregistered_examples()}
    containers = {u.dir for u in unregistered.values() if u.kind == "container"}
    problems = []
    for rel in _example_dirs(tree, containers):
        entry, other = by_dir.get(rel), unregistered.get(rel)
        if entry is not None:
            if not entry.versions.contains(version):
                problems.append(f"{rel} exists at {version} but models/{entry.id}.yaml says {entry.versions}")
        elif other is None:
            problems.append(
                f"{rel} at {version} maps to no model: add models/<id>.yaml or an entry to unregistered_examples.yaml"
            )
        elif not other.versions.contains(version):
            problems.append(f"{rel} exists at {version} but unregistered_examples.yaml says {other.versions}")
    assert not problems, "\n".join(problems)


def test_unregistered_examples_ranges_are_exact(mm_tree: MMTrees) -> None:
    """Each unregistered examples/ dir is claimed exactly at the versions whose tree has it."""
    claims = [
        Claim(f"unregistered_examples.yaml: {u.dir}", [u.dir], u.versions, [])
        for u in load_unregistered_examples()
    ]
    verdict = judge(claims, _trees())
    assert not verdict.problems, "\n".join(verdict.problems)


def test_the_check_is_not_vacuous(mm_tree: MMTrees) -> None:
    """The judge finds a wrong path, a wrong range and a missing class (guards the test itself)."""
    trees = _trees()
    wan = get_registry().get("wan2.1")
    bogus = [
        Claim("bogus path", ["examples/wan2.1/14b/t2v/posttrain_dpo.sh"], ALWAYS, [wan.versions]),
        Claim("too wide", ["examples/qwen3_6"], ALWAYS, []),
        Claim("too narrow", ["examples/wan2.1"], VersionRange(since="26.0.0"), []),
        Claim("class", [], ALWAYS, [wan.versions], converter=("NoSuchConverter", (), True)),
    ]
    problems = judge(bogus, trees).problems
    for where in ("bogus path", "too wide", "too narrow", "class"):
        assert any(p.startswith(where) for p in problems), (where, problems)
    # A partial tree judges only what it holds; a path elsewhere is counted as unjudged, never as missing.
    assert _is_partial(trees["2.1.0"]) and not _is_partial(trees["26.0.0"])
    assert judgeable(trees["2.1.0"], "examples/wan2.1") and judgeable(trees["2.1.0"], "pretrain_sora.py")
    assert not judgeable(trees["2.1.0"], "mindspeed_mm/fsdp/train/trainer.py")
    blind = judge([Claim("blind", ["mindspeed_mm/fsdp/train/trainer.py"], ALWAYS, [])], trees)
    assert len(blind.unjudged) == 3 and not blind.problems  # 2.1.0-2.3.0 cannot say; 26.0.0 on have it
