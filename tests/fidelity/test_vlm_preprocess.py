"""The bundled runtime's Qwen2.5-VL preprocessing (`runtime.vlmdata`) equals MindSpeed-MM's own (issue 27, item 2).

Records written the way `prepare_dataset` writes them (`conversations.to_mllm` under the data config's `attr`),
with real PNG/JPEG images, go through MindSpeed-MM's `get_qwen2vl_dataset` and its qwen2vl collator in a child
process (`upstream_vlmdata.py`, at 26.0.0 and 26.1.0) and through `VLMSource` + `collate_vlm` here, with the same
tiny Qwen2.5-VL tokenizer and image processor. Compared, exactly: per record the token ids, the labels (so the
-100 mask), the attention mask and the image files; per batch every tensor the collator returns (`input_ids`,
`attention_mask`, `labels`, `pixel_values`, `image_grid_thw`) and no other key. Cases: the stock data_3b.json
config (1 image, 2 images, 2 turns, text only, a grey image, a 20x12 image, a JPEG; a batch of text only, which
gets the collator's stand-in image); a system turn (attr `system_tag`) and a record-level system prompt (attr `system`);
`mask_history`; `train_on_prompt` with `image_max_pixels`/`image_min_pixels` that resize before the processor;
a `--seq-length` that truncates prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mm_agent.dataset.conversations import Attr, Refusal, to_mllm
from tests.fidelity.conftest import MMTrees
from tests.vlmdata_fixture import data_config, shapes_dataset, tiny_qwen25vl, turn

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL")

HERE = Path(__file__).resolve().parent
VERSIONS = ("26.0.0", "26.1.0")


def _case(
    root: Path,
    name: str,
    seq_length: int,
    batches: list[list[int]],
    records: list[dict[str, Any]],
    **cfg: Any,
) -> dict[str, Any]:
    """A data config + its MLLM file, records rewritten by mm-agent's writer under the config's attr."""
    config = data_config(
        root / f"{name}.json", model="model", dataset=f"data/{name}.json", dataset_dir="data", **cfg
    )
    attr = Attr.from_config(json.loads(config.read_text()))
    written = []
    for record in records:
        out = to_mllm(record, attr)
        assert not isinstance(out, Refusal), out
        written.append(out)
    (root / "data" / f"{name}.json").write_text(json.dumps(written, indent=1))
    return {
        "name": name,
        "data_config": str(config),
        "base": str(root),
        "seq_length": seq_length,
        "batches": batches,
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("vlm")
    tiny_qwen25vl(root / "model")
    records = shapes_dataset(root / "data")
    plain, system = records[:7], records[7]
    system_key = {**records[0], "system": "Name the colour."}
    long_text = {"messages": [turn("user", "Compare the two pictures. " * 6), turn("assistant", "red " * 4)]}
    return root, [
        _case(root, "stock", 1024, [[0, 1, 3], [3], [2, 4, 5, 6], [6, 5, 4, 3, 2, 1, 0]], plain),
        _case(root, "system", 1024, [[0, 1]], [system, records[2]], attr={"system_tag": "system"}),
        _case(root, "syskey", 1024, [[1, 0]], [system_key, records[0]], attr={"system": "system"}),
        _case(root, "history", 1024, [[0, 1]], [records[2], records[1]], basic={"mask_history": True}),
        _case(
            root,
            "prompt",
            1024,
            [[0, 1, 2]],
            [records[1], records[5], records[6]],
            basic={"train_on_prompt": True},
            pre={"image_max_pixels": 4096, "image_min_pixels": 1024},
        ),
        _case(root, "cutoff", 32, [[0, 1]], [records[0], long_text]),
    ]


@pytest.fixture(scope="module", params=VERSIONS)
def upstream_run(
    request: pytest.FixtureRequest, mm_tree: MMTrees, cases: tuple[Path, list[dict[str, Any]]]
) -> tuple[dict[str, Any], Path]:
    version = request.param
    tree, mindspeed = mm_tree.version_dir(version), mm_tree.mindspeed_dir(version)
    if tree is None or mindspeed is None:
        pytest.skip(f"no MindSpeed-MM/MindSpeed {version} tree under {mm_tree.root}")
    root, specs = cases
    out = root / f"upstream-{version}"
    spec = {
        "mm": str(tree),
        "mindspeed": str(mindspeed),
        "megatron": str(mm_tree.megatron_dir()),
        "out": str(out),
        "cases": specs,
    }
    (root / f"spec-{version}.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(HERE / "upstream_vlmdata.py"), str(root / f"spec-{version}.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    result_file = out / "result.json"
    assert result_file.is_file(), (
        f"upstream_vlmdata.py wrote no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    result: dict[str, Any] = json.loads(result_file.read_text())
    assert "error" not in result, result["error"]
    assert result["files"][0].startswith(str(tree)), result["files"]  # that release's code ran
    return result, out


@pytest.mark.parametrize("name", ["stock", "system", "syskey", "history", "prompt", "cutoff"])
def test_runtime_preprocessing_equals_mindspeed_mm(
    name: str, cases: tuple[Path, list[dict[str, Any]]], upstream_run: tuple[dict[str, Any], Path]
) -> None:
    from runtime.vlmdata import VLMSource, collate_vlm

    root, specs = cases
    spec = next(s for s in specs if s["name"] == name)
    result, out = upstream_run
    theirs = result["cases"][name]
    assert "error" not in theirs, theirs["error"]
    source = VLMSource(spec["data_config"], seq_length=spec["seq_length"], base=root)
    assert len(theirs["items"]) == len(source)  # MindSpeed-MM kept every record
    for i, item in enumerate(theirs["items"]):
        mine = source[i]
        assert mine["input_ids"].tolist() == item["input_ids"], f"record {i}: token ids"
        assert mine["labels"].tolist() == item["labels"], f"record {i}: labels"
        assert mine["attention_mask"].tolist() == item["attention_mask"], f"record {i}: attention mask"
        assert source.examples[i].images == [root / p for p in item["images"] or []], f"record {i}: images"
    for b, (indices, batch) in enumerate(zip(spec["batches"], theirs["batches"], strict=True)):
        expected = torch.load(out / batch["file"])
        got = collate_vlm([source[i] for i in indices], source.pad_token_id, source.label_pad_id)
        assert sorted(got) == batch["keys"] == sorted(expected), f"batch {b}: keys"
        for key, tensor in expected.items():
            assert got[key].dtype == tensor.dtype, f"batch {b}: {key} dtype"
            assert torch.equal(got[key], tensor), f"batch {b}: {key}"
    if name == "cutoff":  # the case does cut: the prompt of record 0 loses its tail
        assert len(theirs["items"][0]["input_ids"]) == 32
    if name == "stock":
        assert (
            torch.load(out / theirs["batches"][1]["file"])["image_grid_thw"].shape[0] == 1
        )  # stand-in image
