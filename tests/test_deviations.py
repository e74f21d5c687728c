"""Declared stock deviations and user choices are data: a bad entry is refused naming the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_agent.errors import MMAgentError
from mm_agent.registry.deviations import (
    DEVIATIONS_DIR,
    deviations_for,
    load_deviations,
    load_user_choices,
    user_choices,
)

GOOD = """deviations:
  - model: wan2.1
    task: t2v
    size: 14b
    versions: {since: "26.0.0"}
    file: pretrain.sh
    key: TASK_QUEUE_ENABLE
    reason: "level 2 is the CANN recommendation for this model"
    evidence:
      - {file: examples/wan2.1/14b/t2v/pretrain.sh, text: "export TASK_QUEUE_ENABLE=2"}
"""

CHOICES = """user_choices:
  - {key: "--load", kind: path, reason: "the user's converted weights folder"}
"""


def _folder(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "_user_choices.yaml").write_text(CHOICES, encoding="utf-8")
    return tmp_path


def test_good_entry_loads_and_matches(tmp_path: Path) -> None:
    entry = load_deviations(_folder(tmp_path, "wan2.1.yaml", GOOD))["wan2.1"][0]
    hit = dict(
        model="wan2.1", task="t2v", size="14b", backend=None, file="pretrain.sh", key="TASK_QUEUE_ENABLE"
    )
    assert entry.applies(version="26.1.0", **hit)
    assert not entry.applies(version="2.3.0", **hit)
    assert not entry.applies(version="26.1.0", **{**hit, "size": "1.3b"})
    assert not entry.applies(version="26.1.0", **{**hit, "key": "COMBINED_ENABLE"})
    assert [c.key for c in load_user_choices(tmp_path)] == ["--load"]
    assert [(e.file, e.text, e.present, e.tree) for e in entry.evidence] == [
        ("examples/wan2.1/14b/t2v/pretrain.sh", "export TASK_QUEUE_ENABLE=2", True, "MindSpeed-MM")
    ]


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('    reason: "level 2 is the CANN recommendation for this model"\n', "", "deviations.0.reason"),
        ("level 2 is the CANN recommendation for this model", "  ", "deviations.0.reason"),
        ("    key: TASK_QUEUE_ENABLE\n", "", "deviations.0.key"),
        ("    task: t2v\n", "    task: t2x\n", "deviations.0.task"),
        ("    file: pretrain.sh\n", "    file: pretrain.sh\n    flie: x\n", "deviations.0.flie"),
        # a reason must carry the upstream text it rests on, checkable by the fidelity suite
        (
            '    evidence:\n      - {file: examples/wan2.1/14b/t2v/pretrain.sh, text: "export TASK_QUEUE_ENABLE=2"}\n',
            "",
            "deviations.0.evidence",
        ),
        (
            "file: examples/wan2.1/14b/t2v/pretrain.sh",
            "file: /abs/pretrain.sh",
            "deviations.0.evidence.0.file",
        ),
        (
            "file: examples/wan2.1/14b/t2v/pretrain.sh",
            "file: ../MindSpeed/x.py",
            "deviations.0.evidence.0.file",
        ),
        ('text: "export TASK_QUEUE_ENABLE=2"', 'text: "   "', "deviations.0.evidence.0.text"),
        (
            'text: "export TASK_QUEUE_ENABLE=2"}',
            'text: "x=2", tree: Megatron}',
            "deviations.0.evidence.0.tree",
        ),
        (
            'text: "export TASK_QUEUE_ENABLE=2"}',
            'text: "x=2", present: maybe}',
            "deviations.0.evidence.0.present",
        ),
    ],
)
def test_bad_entry_names_file_and_field(tmp_path: Path, old: str, new: str, field: str) -> None:
    assert old in GOOD
    folder = _folder(tmp_path, "wan2.1.yaml", GOOD.replace(old, new))
    with pytest.raises(MMAgentError) as info:
        load_deviations(folder)
    assert info.value.file == str(folder / "wan2.1.yaml")
    assert info.value.field == field


def test_entry_in_another_models_file_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "wan2.2.yaml", GOOD)
    with pytest.raises(MMAgentError) as info:
        load_deviations(folder)
    assert info.value.field == "deviations.0.model"
    assert "wan2.1.yaml" in (info.value.fix or "")


def test_bad_user_choice_kind_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_user_choices.yaml").write_text(
        CHOICES.replace("kind: path", "kind: maybe"), encoding="utf-8"
    )
    with pytest.raises(MMAgentError) as info:
        load_user_choices(tmp_path)
    assert info.value.field == "user_choices.0.kind"


def test_shipped_data_loads() -> None:
    shipped = load_deviations(DEVIATIONS_DIR)
    assert user_choices(), "the user-choice list is empty"
    for model, entries in shipped.items():
        assert deviations_for(model) == entries
        assert all(entry.evidence for entry in entries), f"{model}: a deviation without evidence"
