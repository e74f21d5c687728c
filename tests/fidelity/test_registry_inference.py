"""A task whose stock example folder ships an inference script names that script's entry point.

Why: `inference_script` is what route_model's inference stage and the sampling templates read; left out, the
answer said "No inference script for this task" for InternVL3 although examples/internvl3/inference_internvl.sh
ships with every version that trains it. Judged on the MindSpeed-MM trees themselves: for each model task and
each version that has both, the folder of the task's stock example script is read for `inference*.sh`; when
there is one, the registry must name an inference script, and it must be the root entry point (`*.py`) those
shell scripts run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mm_agent.registry import get_registry
from mm_agent.registry.schema import version_key

from .conftest import MMTrees

VERSIONS = sorted(get_registry().versions.ids, key=version_key)
# Preference and RL tuning sample with the base task's inference script; mm-agent renders no sampling stage
# for them (their stock folders are the base model's, so the scripts there are not theirs).
POST_TRAINING = frozenset({"dpo", "grpo"})
_ENTRY = re.compile(r"^\s*(?:torchrun\s.*?|python3?\s+)?([A-Za-z0-9_]+\.py)\b", re.M)


def _entries(scripts: list[Path]) -> set[str]:
    """The root-level Python entry points the shell scripts run."""
    return {m for s in scripts for m in _ENTRY.findall(s.read_text(encoding="utf-8", errors="replace"))}


def test_tasks_with_a_stock_inference_script_name_its_entry(mm_tree: MMTrees) -> None:
    problems: list[str] = []
    judged = 0
    for entry in get_registry().models.values():
        for task in entry.tasks:
            if task.example_script is None or task.id in POST_TRAINING:
                continue
            for version in VERSIONS:
                tree = mm_tree.version_dir(version)
                if tree is None or not (entry.versions.contains(version) and task.versions.contains(version)):
                    continue
                folder = (tree / task.example_script).parent
                scripts = sorted(folder.glob("inference*.sh")) if folder.is_dir() else []
                if not scripts:
                    continue
                judged += 1
                where = f"{entry.id} {task.id} ({task.backend}) at {version}"
                shipped = ", ".join(s.relative_to(tree).as_posix() for s in scripts)
                if task.inference_script is None:
                    problems.append(f"{where}: no inference_script, but {shipped} ships")
                    continue
                runs = _entries(scripts)
                if runs and task.inference_script.path not in runs:
                    problems.append(
                        f"{where}: inference_script {task.inference_script.path}; {shipped} run {runs}"
                    )
    assert judged, "no task with a stock inference script judged: the check would be vacuous"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("model", ["internvl3", "internvl2.5"])
def test_internvl_inference_is_the_stock_entry(model: str, mm_tree: MMTrees) -> None:
    """The issue's case, spelt out: 26.0.0's examples/<model>/inference_internvl.sh runs inference_vlm.py."""
    tree = mm_tree.version_dir("26.0.0")
    assert tree is not None
    script = tree / "examples" / model / "inference_internvl.sh"
    task = get_registry().get(model).task("sft", None)
    assert task is not None and task.inference_script is not None
    assert task.inference_script.path in _entries([script])
