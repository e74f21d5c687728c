"""`to_mllm`'s records, read by MindSpeed-MM's own `SharegptDatasetConverter` and placeholder check.

A child process (this file, run as a script) imports `convert.py` and `mm_plugin.py` from
`$MM_UPSTREAM/MindSpeed-MM/v26.1.0` and, for each case, builds `DatasetAttr(**attr)` from the data config's attr
block exactly as `get_qwen2vl_dataset` does, converts the record with the converter `get_dataset_converter`
picks, and runs `MMPluginMixin._validate_messages` (the check the Qwen2-VL plugin makes before tokenising) on
the result. Converted records must give the same prompt/response turns, system prompt and media; for records
`to_mllm` refuses, the same content copied naively into the model's shape must be one MindSpeed-MM drops
(empty prompt and response) or fails on (the placeholder check raises).

What is replaced, and why: the package `__init__`s of `mindspeed_mm`, `mindspeed_mm.data`, `.data_utils` and
`.func_utils` (they import the training stack and megatron), by empty packages over the real folders; and
`data_utils.video_processor` / `video_reader` (torchvision, av decoding, megatron), by modules holding the two
class names `convert.py` imports and uses only for the video reward dataset. `convert.py`, `mm_plugin.py`,
`log.py` and `model_args.py` run as written, with the real torch and transformers.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

VERSION = "v26.1.0"


def _child(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    root = Path(spec["mm"]) / "mindspeed_mm"
    for name, folder in (
        ("mindspeed_mm", root),
        ("mindspeed_mm.data", root / "data"),
        ("mindspeed_mm.data.data_utils", root / "data" / "data_utils"),
        ("mindspeed_mm.data.data_utils.func_utils", root / "data" / "data_utils" / "func_utils"),
    ):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    for name, cls in (("video_processor", "VideoProcessor"), ("video_reader", "VideoReader")):
        module = types.ModuleType(f"mindspeed_mm.data.data_utils.{name}")
        setattr(module, cls, type(cls, (), {}))
        sys.modules[module.__name__] = module
    convert = importlib.import_module("mindspeed_mm.data.data_utils.func_utils.convert")
    plugin = importlib.import_module("mindspeed_mm.data.data_utils.func_utils.mm_plugin")
    data_args = convert.DataArguments(dataset_dir=spec["dataset_dir"], dataset="mllm.json")
    results = []
    for case in spec["cases"]:
        attr = convert.DatasetAttr(**case["attr"])
        example = convert.get_dataset_converter(attr.formatting, attr, data_args)(case["record"])
        try:
            plugin.MMPluginMixin._validate_messages(
                example["_prompt"] + example["_response"],
                example["_images"] or [],
                example["_videos"] or [],
                [],
            )
            placeholder_error = None
        except ValueError as exc:
            placeholder_error = str(exc)
        results.append(
            {
                "prompt": example["_prompt"],
                "response": example["_response"],
                "system": example["_system"],
                "images": example["_images"],
                "videos": example["_videos"],
                "placeholder_error": placeholder_error,
                "convert_file": convert.__file__,
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    _child(sys.argv[1])
    sys.exit(0)

import pytest  # noqa: E402 (the child above runs without the test machinery)

from mm_agent.dataset.conversations import Attr, to_mllm  # noqa: E402
from mm_agent.dataset.limits import Refusal  # noqa: E402


def _stock_attr(mm: Path) -> dict[str, Any]:
    config = json.loads((mm / "examples" / "qwen2.5vl" / "data_7b.json").read_text())
    return config["dataset_param"]["attr"]


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _bot(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


INPUTS: list[dict[str, Any]] = [
    {  # LLaVA, several turns
        "image": "coco/1.jpg",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat is this?"},
            {"from": "gpt", "value": "A cat."},
            {"from": "human", "value": "Colour?"},
            {"from": "gpt", "value": "Grey."},
        ],
    },
    {  # ShareGPT, two images and no placeholders: inserted
        "conversations": [{"from": "user", "value": "Compare."}, {"from": "assistant", "value": "Same."}],
        "images": ["coco/1.jpg", "coco/2.jpg"],
    },
    {  # OpenAI parts with a system prompt
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A dog."}]},
        ],
        "images": ["coco/2.jpg"],
    },
    {"messages": [_user("Just text."), _bot("Fine.")]},
    {"messages": [_user("<video>Describe."), _bot("Rain.")], "videos": ["clips/v.mp4"]},
]

# Attr blocks as data configs write them: the stock Qwen2.5-VL one (filled in from upstream below), MindSpeed-MM's
# DatasetAttr defaults with an images column, and a block that reads videos and a system column.
DEFAULTS_BLOCK = {"images": "images"}
VIDEO_BLOCK = {**DEFAULTS_BLOCK, "videos": "videos", "system": "sys", "system_tag": None}


def _expected(record: dict[str, Any], attr: Attr, dataset_dir: Path) -> dict[str, Any]:
    """What MindSpeed-MM should read from `record` (in attr's shape): turns with roles mapped, the system
    prompt, media joined to the dataset folder (the files exist there)."""
    roles = {attr.user_tag: "user", attr.assistant_tag: "assistant"}
    turns = record[attr.messages]
    system = ""
    if attr.system_tag and turns[0][attr.role_tag] == attr.system_tag:
        system, turns = turns[0][attr.content_tag], turns[1:]
    elif attr.system:
        system = record[attr.system]
    aligned = [{"role": roles[t[attr.role_tag]], "content": t[attr.content_tag]} for t in turns]

    def media(column: str | None) -> list[str] | None:
        paths = record.get(column) if column else None
        return [str(dataset_dir / p) for p in paths] if paths else None

    return {
        "prompt": aligned[:-1],
        "response": aligned[-1:],
        "system": system,
        "images": media(attr.images),
        "videos": media(attr.videos),
        "placeholder_error": None,
    }


def _run(mm: Path, dataset_dir: Path, cases: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"mm": str(mm), "dataset_dir": str(dataset_dir), "cases": cases}))
    proc = subprocess.run(
        [sys.executable, __file__, str(spec)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {Path(r["convert_file"]).resolve() for r in results} == {
        (mm / "mindspeed_mm/data/data_utils/func_utils/convert.py").resolve()
    }
    return results


def _naive(record: dict[str, Any], attr: Attr) -> dict[str, Any]:
    """A refused record's content copied into attr's shape as-is (roles renamed only, media listed as given)."""
    tags = {"user": attr.user_tag, "assistant": attr.assistant_tag, "system": attr.system_tag or "system"}
    out: dict[str, Any] = {
        attr.messages: [
            {attr.role_tag: tags[t["role"]], attr.content_tag: t["content"]} for t in record["messages"]
        ]
    }
    for column, key in ((attr.images, "images"), (attr.videos, "videos")):
        if column:
            out[column] = record.get(key, [])
    return out


REFUSED: list[dict[str, Any]] = [
    {"messages": [_bot("a"), _user("q")]},
    {"messages": [_user("q"), _bot("a"), _user("q2")]},
    {"messages": [_user("q"), _user("q2"), _bot("a")]},
    {"messages": [{"role": "system", "content": "S"}, _user("q"), _bot("a")]},  # stock attr: no system tag
    {"messages": [_user("<image><image>q"), _bot("a")], "images": ["coco/1.jpg"]},
    {"messages": [_user("<image>q"), _bot("a")], "images": ["coco/1.jpg", "coco/2.jpg", "coco/3.jpg"]},
    {"messages": [_user("<image>q"), _bot("a")]},
]


@pytest.fixture(scope="module")
def mm(upstream: Path) -> Path:
    tree = upstream / "MindSpeed-MM" / VERSION
    if not (tree / "mindspeed_mm/data/data_utils/func_utils/convert.py").is_file():
        pytest.skip(f"{tree} holds no mindspeed_mm/data (MindSpeed-MM's data code)")
    return tree


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for name in ("coco/1.jpg", "coco/2.jpg", "coco/3.jpg", "clips/v.mp4"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


def test_converted_records_read_the_same_in_mindspeed_mm(mm: Path, dataset_dir: Path, tmp_path: Path) -> None:
    blocks = [_stock_attr(mm), DEFAULTS_BLOCK, VIDEO_BLOCK]
    cases, expected = [], []
    for block in blocks:
        attr = Attr.from_config({"dataset_param": {"attr": block}})
        for record in INPUTS:
            converted = to_mllm(record, attr)
            if isinstance(converted, Refusal):  # videos or the system prompt on a block without them
                assert converted.code in ("no_videos_in_model", "system_unsupported"), converted
                continue
            cases.append({"attr": block, "record": converted})
            expected.append(_expected(converted, attr, dataset_dir))
    assert len(cases) >= 12, "too few conversions reached MindSpeed-MM"
    results = _run(mm, dataset_dir, cases, tmp_path)
    for case, want, got in zip(cases, expected, results, strict=True):
        assert {k: got[k] for k in want} == want, case
        assert got["response"], f"MindSpeed-MM dropped {case}"


def test_refused_records_are_ones_mindspeed_mm_drops_or_fails_on(
    mm: Path, dataset_dir: Path, tmp_path: Path
) -> None:
    block = _stock_attr(mm)
    attr = Attr.from_config({"dataset_param": {"attr": block}})
    cases = []
    for record in REFUSED:
        assert isinstance(to_mllm(record, attr), Refusal), record
        cases.append({"attr": block, "record": _naive(record, attr)})
    for got, case in zip(_run(mm, dataset_dir, cases, tmp_path), cases, strict=True):
        dropped = got["prompt"] == [] and got["response"] == []
        assert dropped or got["placeholder_error"], f"MindSpeed-MM reads {case} as {got}"
