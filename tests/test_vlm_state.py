"""`mm_agent.convert.vlm_state`: the bundled VLM runtime's in-memory HF <-> MindSpeed-MM state dicts are the
native converter's rank file, tensor for tensor, and undo exactly (tied and untied embeddings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_convert_qwen import build_model  # noqa: E402

from mm_agent.convert import vlm_state  # noqa: E402
from mm_agent.convert.engine import execute  # noqa: E402
from mm_agent.convert.schema import ConvertRequest  # noqa: E402
from mm_agent.errors import MMAgentError  # noqa: E402


@pytest.mark.parametrize("tie", [False, True])
def test_in_memory_maps_equal_the_converter_and_round_trip(tmp_path: Path, tie: bool) -> None:
    hf = build_model(tmp_path / "hf", tie=tie)
    config = json.loads((hf / "config.json").read_text())
    state = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(hf).state_dict()

    mm = vlm_state.hf_to_mm(state, config)
    execute(ConvertRequest(converter="Qwen2_5_VLConverter", method="hf_to_mm", source=str(hf),
                           target=str(tmp_path / "mm"), confirm=True))  # fmt: skip
    written = torch.load(
        tmp_path / "mm" / "release" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False
    )
    assert set(mm) == set(written["model"])
    assert all(torch.equal(mm[k], written["model"][k]) for k in mm)

    back = vlm_state.mm_to_hf(mm, config)
    expected = {k for k in state if not (tie and k == "lm_head.weight")}  # tied: no separate output layer
    assert set(back) == expected
    assert all(torch.equal(back[k], state[k]) for k in back)


def test_an_unknown_tensor_is_refused_naming_the_table(tmp_path: Path) -> None:
    hf = build_model(tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    state = dict(transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(hf).state_dict())
    state["model.language_model.extra.weight"] = torch.zeros(2)
    with pytest.raises(MMAgentError) as err:
        vlm_state.hf_to_mm(state, config)
    assert "model.language_model.extra.weight" in err.value.message
    assert err.value.file is not None and err.value.file.endswith("Qwen2_5_VLConverter.yaml")
