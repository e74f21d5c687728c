"""Every declared stock deviation's reason rests on upstream text that is there at each version it covers.

A deviation (`mm_agent/registry/data/deviations/<model>.yaml`) says why a rendered job differs from MindSpeed-MM's
stock example; its `evidence` quotes the upstream lines the reason rests on (the stock value, the line of code that
reads or ignores the key). Here each quote is looked up in the real tree of every version the deviation covers
(26.0.0 and 26.1.0, the versions the stock diff judges, within the deviation's, the model's and the task's ranges,
narrowed by the evidence's own `versions`): a reason that quotes a line the stock file lacks, or says nothing reads a
variable that upstream code reads, fails here. `present: false` evidence is a claim of absence and fails when the
text is found. The same check on reasons this repository once shipped shows it catches them.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from mm_agent.registry import get_registry
from mm_agent.registry.deviations import Deviation, Evidence, load_deviations
from tests.fidelity.conftest import MMTrees

VERSIONS = ("26.0.0", "26.1.0")
SHIPPED = load_deviations()
CASES = [(model, i) for model, entries in sorted(SHIPPED.items()) for i in range(len(entries))]


def _flat(text: str) -> str:
    return " ".join(text.split())


@functools.lru_cache(maxsize=512)
def _read_flat(path: str) -> str | None:
    file = Path(path)
    return _flat(file.read_text(encoding="utf-8", errors="replace")) if file.is_file() else None


def tree_of(trees: MMTrees, evidence: Evidence, version: str) -> Path | None:
    if evidence.tree == "MindSpeed-MM":
        return trees.version_dir(version)
    if evidence.tree == "MindSpeed":
        return trees.mindspeed_dir(version)
    return trees.megatron_dir()


def versions_of(deviation: Deviation, evidence: Evidence) -> list[str]:
    """The judged versions this evidence must hold at: the deviation's, the model's and (if named) the task's
    ranges, narrowed by the evidence's own."""
    entry = get_registry().get(deviation.model)
    tasks = [t for t in entry.tasks if deviation.task in (None, t.id)]
    tasks = [t for t in tasks if deviation.backend in (None, t.backend)]
    return [
        v
        for v in VERSIONS
        if deviation.versions.contains(v)
        and entry.versions.contains(v)
        and any(t.versions.contains(v) for t in tasks)
        and (evidence.versions is None or evidence.versions.contains(v))
    ]


def check(trees: MMTrees, deviation: Deviation) -> tuple[int, list[str]]:
    """(quotes checked, what failed) for one deviation."""
    checked, failed = 0, []
    for evidence in deviation.evidence:
        for version in versions_of(deviation, evidence):
            root = tree_of(trees, evidence, version)
            if root is None or not root.is_dir():
                failed.append(f"{evidence.tree} {version}: no tree under $MM_UPSTREAM")
                continue
            text = _read_flat(str(root / evidence.file))
            where = f"{evidence.tree} {version} {evidence.file}"
            checked += 1
            if text is None:
                failed.append(f"{where}: no such file")
            elif (_flat(evidence.text) in text) != evidence.present:
                said = "does not hold" if evidence.present else "holds"
                failed.append(f"{where} {said} {evidence.text!r}")
    return checked, failed


@pytest.mark.parametrize(("model", "index"), CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_deviation_evidence_holds_upstream(mm_tree: MMTrees, model: str, index: int) -> None:
    deviation = SHIPPED[model][index]
    checked, failed = check(mm_tree, deviation)
    assert not failed, (
        f"deviations/{model}.yaml entry {index} ({deviation.file} {deviation.key}): its reason rests on upstream "
        "text that is not as quoted; fix the reason and its evidence, or render the stock value:\n  "
        + "\n  ".join(failed)
    )
    assert checked, (
        f"deviations/{model}.yaml entry {index} ({deviation.file} {deviation.key}) covers none of {VERSIONS}: "
        "its evidence is never checked"
    )


def _old(
    model: str, key: str, evidence: list[dict[str, object]], versions: dict[str, str] | None = None
) -> Deviation:
    return Deviation.model_validate(
        {
            "model": model,
            "file": "config.yaml",
            "key": key,
            "versions": versions or {},
            "reason": "a reason this repository once shipped",
            "evidence": evidence,
        }
    )


@pytest.mark.parametrize(
    "deviation",
    [
        # "the stock config leaves `save` commented out (`# save: save_path`)": the Kimi-K3 config has no such line
        _old(
            "kimi_k3",
            "training.save",
            [{"file": "examples/kimi_k3/kimik3_config.yaml", "text": "# save: save_path"}],
        ),
        _old(
            "step3_vl",
            "training.save",
            [{"file": "examples/step3_vl/step3_vl_10b_config.yaml", "text": "# save:"}],
        ),
        # "no code in MindSpeed-MM 26.1.0 reads ENABLE_GC_THRESHOLD": pretrain_transformers.py:15 does
        _old(
            "qwen3vl",
            "ENABLE_GC_THRESHOLD",
            [
                {
                    "file": "pretrain_transformers.py",
                    "text": 'os.getenv("ENABLE_GC_THRESHOLD")',
                    "present": False,
                }
            ],
            {"since": "26.1.0"},
        ),
    ],
    ids=["kimi_k3-save", "step3_vl-save", "qwen3vl-gc-threshold"],
)
def test_false_reasons_once_shipped_fail(mm_tree: MMTrees, deviation: Deviation) -> None:
    checked, failed = check(mm_tree, deviation)
    assert checked and failed, f"{deviation.model} {deviation.key}: the false quote was not caught"
