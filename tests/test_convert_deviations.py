"""The declared differences from MindSpeed-MM's converters (`mappings/upstream_deviations.yaml`): the shipped
table loads, a bad table is refused naming the file and the field, and a deviation allows exactly the
differences it names (converter, kind, name, where). The comparison itself: tests/fidelity/test_converters.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_agent.convert.deviations import DEVIATIONS_FILE, Difference, load_deviations
from mm_agent.convert.mapping import MAPPINGS_DIR, load_mapping
from mm_agent.errors import MMAgentError

GOOD = """\
deviations:
  - id: norms-on-first-stage
    converters: [WanConverter]
    kind: tensor_extra
    names: [img_emb.proj.0.weight]
    where: [release/mp_rank_??_000/model_optim_rng.pt:model]
    reason: MindSpeed-MM drops the image embedder's LayerNorms at PP > 1; mm-agent keeps them.
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "upstream_deviations.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_table_loads_and_names_real_converters() -> None:
    table = load_deviations()
    assert DEVIATIONS_FILE.parent == MAPPINGS_DIR
    assert table.deviations, "the fidelity test found differences; the table must declare them"
    for dev in table.deviations:
        for converter in dev.converters:
            load_mapping(converter)  # each names a converter with a mapping table
    assert {d.id for d in table.for_converter("WanConverter")} >= {"wan-i2v-image-embedder-norms"}


def test_allows_only_what_it_names(tmp_path: Path) -> None:
    table = load_deviations(write(tmp_path, GOOD))
    diff = Difference(
        kind="tensor_extra",
        file="release/mp_rank_00_000/model_optim_rng.pt:model",
        name="img_emb.proj.0.weight",
    )
    assert table.allowing("WanConverter", diff) is not None
    assert table.allowing("Qwen2_5_VLConverter", diff) is None  # another converter
    assert table.allowing("WanConverter", diff.model_copy(update={"kind": "tensor_missing"})) is None
    assert table.allowing("WanConverter", diff.model_copy(update={"name": "img_emb.proj.1.weight"})) is None
    last_stage = diff.model_copy(update={"file": "release/mp_rank_00_001/model_optim_rng.pt:model"})
    assert table.allowing("WanConverter", last_stage) is None  # outside `where`
    assert "tensor_extra: img_emb.proj.0.weight in release/mp_rank_00_000" in str(diff)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("converters: [WanConverter]", "converters: [NoSuchConverter]", "deviations.0"),
        ("kind: tensor_extra", "kind: tensor_moved", "deviations.0.kind"),
        ("id: norms-on-first-stage", "id: Norms_On_First", "deviations.0.id"),
        ("names: [img_emb.proj.0.weight]", "names: []", "deviations.0.names"),
        ("kind: tensor_extra", "kind: tensor_extra\n    stage: first", "deviations.0.stage"),
        ("reason: MindSpeed-MM drops the image embedder's LayerNorms at PP > 1; mm-agent keeps them.",
         "reason: because", "deviations.0.reason"),
    ],
)  # fmt: skip
def test_bad_entries_name_file_and_field(tmp_path: Path, old: str, new: str, field: str) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(MMAgentError) as info:
        load_deviations(path)
    assert info.value.file == str(path) and info.value.field == field


def test_repeated_ids_are_refused(tmp_path: Path) -> None:
    entry = GOOD.split("deviations:\n", 1)[1]
    path = write(tmp_path, GOOD + entry)
    with pytest.raises(MMAgentError, match="deviation ids repeat"):
        load_deviations(path)


def test_the_table_is_not_taken_for_a_converter() -> None:
    with pytest.raises(MMAgentError) as info:
        load_mapping("NoSuchConverter")
    assert "upstream_deviations" not in (info.value.fix or "") and "WanConverter" in (info.value.fix or "")
