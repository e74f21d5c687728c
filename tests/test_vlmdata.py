"""`runtime.vlmdata`: the Qwen2.5-VL preprocessing's labels, image tokens, batches and refusals, on a tiny real
tokenizer and image processor (`tests/vlmdata_fixture.py`). Equality with MindSpeed-MM's own code is
`tests/fidelity/test_vlm_preprocess.py`; these pin the behaviour without the upstream tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.vlmdata_fixture import data_config, shapes_dataset, tiny_qwen25vl, turn

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL")

from runtime.errors import RuntimeFailure  # noqa: E402
from runtime.vlmdata import IGNORE_INDEX, VLMSource, collate_vlm  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vlmdata")
    tiny_qwen25vl(root / "model")
    records = shapes_dataset(root / "data")
    (root / "data" / "plain.json").write_text(json.dumps(records[:7]))
    (root / "data" / "all.json").write_text(json.dumps(records))
    return root


def _source(root: Path, name: str = "plain", records: list[Any] | None = None, **cfg: Any) -> VLMSource:
    """The source of config `name`: over `records` (written as data/<name>.json), else data/plain.json (the
    first seven shapes records) or data/all.json when `name` is "all"."""
    data = name if records is not None or name == "all" else "plain"
    if records is not None:
        (root / "data" / f"{data}.json").write_text(json.dumps(records))
    seq = cfg.pop("seq_length", None)
    config = data_config(
        root / f"{name}-cfg.json", model="model", dataset=f"data/{data}.json", dataset_dir="data", **cfg
    )
    return VLMSource(str(config), seq_length=seq, base=root)


def _trained(source: VLMSource, i: int) -> str:
    labels = source[i]["labels"]
    return str(source.tokenizer.decode(labels[labels != IGNORE_INDEX]))


def test_labels_cover_the_answers_only(root: Path) -> None:
    source = _source(root)
    assert (
        _trained(source, 2) == "a square<|im_end|>\nblue<|im_end|>\n"
    )  # both answers of the two-turn record
    text = source.tokenizer.decode(source[2]["input_ids"])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert _trained(source, 0) == "red<|im_end|>\n"
    # every trained token is the input token at that place (labels are not shifted here: the model shifts)
    item = source[2]
    kept = item["labels"] != IGNORE_INDEX
    assert torch.equal(item["labels"][kept], item["input_ids"][kept])


def test_mask_history_and_train_on_prompt(root: Path) -> None:
    history = _source(root, "history", basic={"mask_history": True})
    assert _trained(history, 2) == "blue<|im_end|>\n"  # the last answer only
    prompt = _source(root, "prompt", basic={"train_on_prompt": True})
    item = prompt[2]
    assert torch.equal(item["labels"], item["input_ids"])


def test_system_turn_and_record_system(root: Path) -> None:
    source = _source(root, "all", attr={"system_tag": "system"})
    assert source.tokenizer.decode(source[7]["input_ids"]).startswith(
        "<|im_start|>system\nAnswer with one word.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
    )
    record = {"messages": [turn("user", "What?"), turn("assistant", "red")], "system": "Be brief."}
    keyed = _source(root, "keyed", [record], attr={"system": "system"})
    assert keyed.tokenizer.decode(keyed[0]["input_ids"]).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n"
    )


def test_each_placeholder_becomes_its_images_tokens(root: Path) -> None:
    source = _source(root)
    merge = source.image_processor.merge_size**2
    tok = source.tokenizer
    start, end, pad = (
        tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
    )
    for i in range(len(source)):
        item = source[i]
        ids = item["input_ids"].tolist()
        grids = item["image_grid_thw"]
        assert item["pixel_values"].shape[0] == int(grids.prod(dim=1).sum())  # patches = t*h*w per image
        starts = [k for k, t in enumerate(ids) if t == start]
        ends = [k for k, t in enumerate(ids) if t == end]
        runs = [e - s - 1 for s, e in zip(starts, ends, strict=True)]
        assert all(set(ids[s + 1 : e]) == {pad} for s, e in zip(starts, ends, strict=True))
        assert runs == [int(g.prod()) // merge for g in grids], f"record {i}"
    assert source[1]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 8, 8]]  # two images, in placeholder order


def test_image_limits_resize_before_the_processor(root: Path) -> None:
    """image_max_pixels shrinks (NEAREST) and image_min_pixels grows an image before the processor sees it; a side
    under 28 is then raised to 28."""
    from PIL import Image

    source = _source(root, "limits", pre={"image_max_pixels": 1600, "image_min_pixels": 1024})
    large = Image.open(root / "data" / "img" / "large.jpg").resize(
        (48, 32), Image.Resampling.NEAREST
    )  # 300x200
    tiny = Image.open(root / "data" / "img" / "tiny.png").resize((41, 24), Image.Resampling.NEAREST)  # 20x12
    tiny = tiny.convert("RGB").resize((41, 28))
    for i, image in ((6, large), (5, tiny)):
        expected = source.image_processor([image], return_tensors="pt")
        assert torch.equal(source[i]["pixel_values"], expected["pixel_values"]), i
        assert torch.equal(source[i]["image_grid_thw"], expected["image_grid_thw"]), i
    default = _source(root, "plain")
    assert default[6]["image_grid_thw"].prod() > source[6]["image_grid_thw"].prod()


def test_batches_pad_right_to_a_multiple_of_eight(root: Path) -> None:
    source = _source(root)
    items = [source[0], source[1], source[3]]
    batch = collate_vlm(items, source.pad_token_id, source.label_pad_id)
    longest = max(len(item["input_ids"]) for item in items)
    assert batch["input_ids"].shape == (3, -(-longest // 8) * 8)
    for r, item in enumerate(items):
        n = len(item["input_ids"])
        assert torch.equal(batch["input_ids"][r, :n], item["input_ids"])
        assert set(batch["input_ids"][r, n:].tolist()) <= {source.pad_token_id}
        assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
        assert set(batch["labels"][r, n:].tolist()) <= {IGNORE_INDEX}
    assert torch.equal(
        batch["pixel_values"], torch.cat([source[0]["pixel_values"], source[1]["pixel_values"]])
    )
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4], [1, 8, 8]]


def test_a_batch_without_images_carries_the_stand_in_image(root: Path) -> None:
    source = _source(root)
    item = source[3]  # text only
    batch = collate_vlm([item], source.pad_token_id, source.label_pad_id)
    n, fake = len(item["input_ids"]), item["fake_input_ids"]
    assert batch["image_grid_thw"].shape == (1, 3)
    assert torch.equal(batch["input_ids"][0, n : n + len(fake)], fake)
    assert batch["attention_mask"][0, n:].sum() == 0  # masked out
    assert (batch["labels"][0, n:] == IGNORE_INDEX).all()
    mixed = collate_vlm([item, source[0]], source.pad_token_id, source.label_pad_id)
    assert torch.equal(mixed["pixel_values"], source[0]["pixel_values"])  # a real image: no stand-in


def _refusal(root: Path, name: str, records: Any = None, **cfg: Any) -> RuntimeFailure:
    with pytest.raises(RuntimeFailure) as info:
        _source(root, name, records, **cfg)
    return info.value


def test_bad_records_name_the_record_and_field(root: Path) -> None:
    ok = {"messages": [turn("user", "<image>What?"), turn("assistant", "red")], "images": ["img/red.png"]}
    missing = _refusal(root, "missing", [ok, {**ok, "images": ["img/nope.png"]}])
    assert missing.field == "[1].images[0]" and missing.file and missing.file.endswith("missing.json")
    assert "nope.png" in missing.message and missing.fix
    count = _refusal(root, "count", [{**ok, "images": ["img/red.png", "img/blue.png"]}])
    assert count.field == "[0].images" and "1 <image> placeholder(s) for 2 image(s)" in count.message
    empty = _refusal(
        root, "empty", [{**ok, "messages": [turn("user", "<image>What?"), turn("assistant", " ")]}]
    )
    assert empty.field == "[0].messages[1].content" and "empty answer" in empty.message
    order = _refusal(
        root, "order", [{**ok, "messages": [turn("assistant", "red"), turn("user", "<image>What?")]}]
    )
    assert order.field == "[0].messages[0].role"
    odd = _refusal(root, "odd", [{**ok, "messages": [turn("user", "<image>What?")]}])
    assert odd.field == "[0].messages"
    video = _refusal(root, "video", [{**ok, "videos": ["a.mp4"]}], attr={"videos": "videos"})
    assert video.field == "[0].videos" and "images only" in video.message
    (root / "data" / "broken.png").write_bytes(b"not a png")
    unreadable = _refusal(root, "unreadable", [{**ok, "images": ["broken.png"]}])
    assert unreadable.field == "[0].images[0]" and "cannot read image" in unreadable.message


def test_a_cutoff_through_image_tokens_is_refused(root: Path) -> None:
    failure = _refusal(root, "plain", seq_length=20)
    assert (
        failure.field == "[0]" and "image tokens" in failure.message and "--seq-length" in (failure.fix or "")
    )


def test_bad_configs_are_refused(root: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as info:
        VLMSource(str(tmp_path / "nope.json"))
    assert "cannot read the data config" in info.value.message
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RuntimeFailure):
        VLMSource(str(tmp_path / "bad.json"))
    unknown = _refusal(root, "plain", basic={"shuffle_seed": 1})
    assert unknown.field == "dataset_param.basic_parameters.shuffle_seed"
    cutoff = _refusal(root, "plain", basic={"cutoff_len": 512})
    assert cutoff.field == "dataset_param.basic_parameters.cutoff_len"
    template = _refusal(root, "plain", basic={"template": "qwen3_vl"})
    assert template.field == "dataset_param.basic_parameters.template"
    no_data = _refusal(root, "plain", basic={"dataset": "data/absent.json"})
    assert no_data.field == "dataset_param.basic_parameters.dataset" and "absent.json" in (no_data.file or "")
    no_model = _refusal(root, "plain", pre={"model_name_or_path": "nowhere"})
    assert no_model.field == "dataset_param.preprocess_parameters.model_name_or_path"


def test_paths_start_in_the_working_directory(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a MindSpeed-MM job: the config's relative paths are read from where the job runs."""
    config = data_config(root / "cwd.json", model="model", dataset="data/plain.json", dataset_dir="data")
    monkeypatch.chdir(root)
    source = VLMSource(str(config), seq_length=None)
    assert len(source) == 7 and source.examples[0].images == [root / "data" / "img" / "red.png"]
    limited = _source(root, "plain", basic={"max_samples": 2})
    assert len(limited) == 2


def test_a_batch_feeds_the_model(root: Path) -> None:
    """transformers' Qwen2.5-VL takes a collated batch as is: one image feature per `<|image_pad|>`, a loss over
    the answers; the stand-in image of a text-only batch too."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    source = _source(root)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(root / "model"))
    for indices in ([0, 1, 2, 4, 5, 6], [3]):
        batch = collate_vlm([source[i] for i in indices], source.pad_token_id, source.label_pad_id)
        with torch.no_grad():
            loss = model(**batch).loss
        assert loss is not None and torch.isfinite(loss), indices


def test_image_tensors_are_reused_within_the_bound(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A later epoch gets the same tensors without decoding again; past PIXEL_CACHE_BYTES nothing more is kept
    (and what is computed is still right)."""
    from runtime import vlmdata

    source = _source(root)
    first = source[0]["pixel_values"]
    decoded: list[int] = []
    original = source._example_pixels
    monkeypatch.setattr(source, "_example_pixels", lambda ex: decoded.append(1) or original(ex))
    assert torch.equal(source[0]["pixel_values"], first) and not decoded
    monkeypatch.setattr(vlmdata, "PIXEL_CACHE_BYTES", source._pixel_bytes)  # full: no room for record 1
    again = [source[1]["pixel_values"], source[1]["pixel_values"]]
    assert len(decoded) == 2 and torch.equal(again[0], again[1]) and 1 not in source._pixel_cache
