"""Child process: MindSpeed-MM's own dataset classes read the files `prepare_dataset` wrote, under the data configs
`render_job` wrote, and its own samplers split samples over ranks.

Usage: `python upstream_readers.py SPEC_JSON`, one process per MindSpeed-MM tree. SPEC holds `mm`, `mindspeed`,
`megatron` (the trees), `out` (the JSON result file) and `cases`, each one of:

- `{"kind": "clips", "reader": "T2VDataset" | "I2VDataset" | "WanTextVideoDataset", "task", "data_config",
  "global_batch_size"}`: the class built from the config's `dataset_param` as MindSpeed-MM builds it
  (`build_mm_dataset`'s `T2VDataset(basic, preprocess, **dataset_param)`, or get_wan_feature.py's
  `WanTextVideoDataset(task, basic, preprocess, **dataset_param)`): DataFileReader reads the index in the config's
  storage mode and select_valid_data filters it, for real. Two things differ, because this machine has no
  tokenizer weights and no torchvision: `use_text_processer` is off (no tokenizer is loaded), and item 0 is read
  by the class's own `getitem` / `__getitem__` with its `video_processer` replaced by a recorder that keeps what
  the real reader gave it (the opened `DecordVideo`, whose frame count is real, and the record) and returns
  zeros. Reported: `len`, every kept record's path/file and caption keys, and item 0's `file`, `text` (Wan's
  reader returns the caption it took), the frames decord read and the record keys.
- `{"kind": "mllm", "convert": module name, "data_config", "dataset"}`: the records of the written JSON through
  `get_dataset_converter(attr.formatting, DatasetAttr(**attr), DataArguments(dataset_dir=...))`, as
  `get_qwen2vl_dataset` / `align_dataset` apply it to each record (`datasets.load_dataset("json")`, not installed
  here, is replaced by reading the JSON list). Reported per record: prompt, response, the image and video paths.
- `{"kind": "cogvideox_clips", "data_config", "clips"}`: each clip through the config's `CogVideoXProcessor` on a
  real `DecordVideo`; with no torchvision here the processor stops in `_resize_for_rectangle_crop` (after every
  temporal decision), so reaching it means the clip passed; any earlier exception means the clip fails at load.
- `{"kind": "sampler", "samples", "world", "mbs", "loader"}`: the samples each rank takes at each step, by the
  classes `prepare_sampler_dataloader` uses for the loader's `sampler_type` (LengthGroupedSampler,
  SequentialSampler's DistributedBatchSampler, StatefulDistributedSampler), one instance per rank, batched as
  its DataLoader batches them (micro batch, drop_last).

Stubbed by an import hook (see stubs.py), and only these: NPU-only modules; `megatron.training`'s and
`mindspeed_mm.data`'s (and the fsdp data packages') `__init__` (the whole training stack; their submodules stay
real); `mindspeed.megatron_adaptor`, `megatron.training.initialize`, `mindspeed_mm.configs.config`,
`mindspeed_mm.models.ae`, `mindspeed_mm.tools.profiler`, `get_sora_feature` (imported by get_wan_feature.py for
the extractor class, never by the dataset class) and `dataloader.bucket_manager` (imported by sampler.py for the
VLM buckets; it needs torchvision); and any third-party module MindSpeed-MM's or MindSpeed's files import that
this environment lacks (`used` in the result). Writes `out`: `{"cases": {name: result}, "used", "files"}`, or
`{"error": traceback}`.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import random
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from stubs import Missing, StubModule, matches  # a sibling module: this script's folder is on sys.path

SPEC = json.loads(Path(sys.argv[1]).read_text())
MM = Path(SPEC["mm"]).resolve()
ROOTS = (str(MM), str(Path(SPEC["mindspeed"]).resolve()))
STUBBED = (
    "torch_npu",
    "torchair",
    "acl",
    "tbe",
    "mindspeed.op_builder",
    "mindspeed.megatron_adaptor",
    "megatron.training.initialize",
    "mindspeed_mm.configs.config",
    "mindspeed_mm.models.ae",
    "mindspeed_mm.tools.profiler",
    "mindspeed_mm.tools.feature_extraction.get_sora_feature",
    "mindspeed_mm.data.dataloader.bucket_manager",
)
_DATA = MM / "mindspeed_mm"
INIT_ONLY = {
    "megatron.training": Path(SPEC["megatron"]) / "megatron" / "training",
    "mindspeed_mm.data": _DATA / "data",
    "mindspeed_mm.fsdp": _DATA / "fsdp",
    "mindspeed_mm.fsdp.data": _DATA / "fsdp" / "data",
    "mindspeed_mm.fsdp.data.data_utils": _DATA / "fsdp" / "data" / "data_utils",
    "mindspeed_mm.fsdp.data.data_utils.func_utils": _DATA / "fsdp" / "data" / "data_utils" / "func_utils",
}
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
ARGS = argparse.Namespace(
    micro_batch_size=1, global_batch_size=1, mm=argparse.Namespace(model=argparse.Namespace())
)
USED: list[str] = []


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if matches(name, STUBBED) or name in INIT_ONLY:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = [str(INIT_ONLY[spec.name])] if spec.name in INIT_ONLY else []
        if spec.name == "megatron.training":
            module.get_args = lambda: ARGS  # type: ignore[attr-defined]
            module.print_rank_0 = lambda message: print(message, flush=True)  # type: ignore[attr-defined]
        if spec.name == "orjson":
            module.loads = json.loads  # type: ignore[attr-defined]
            module.dumps = lambda obj: json.dumps(obj).encode()  # type: ignore[attr-defined]
        if spec.name == "torchvision.datasets.folder":
            module.IMG_EXTENSIONS = IMG_EXTENSIONS  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _no_npu() -> int:
    raise RuntimeError("no NPU on this machine")


def _install() -> None:
    os.environ["NON_MEGATRON"] = "true"
    sys.path[:0] = [ROOTS[0], ROOTS[1], SPEC["megatron"]]
    import transformers  # noqa: F401  (settles what it has before any stub exists)
    from transformers.trainer_pt_utils import LabelSmoother  # noqa: F401

    sys.meta_path.insert(0, _Stubs())
    sys.meta_path.append(Missing(ROOTS, _Stubs(), USED))


def main() -> dict[str, Any]:
    _install()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    from mindspeed_mm.data.datasets import i2v_dataset, t2v_dataset

    # is_npu_available() (lru_cached) finds the torch_npu stub, then asks torch.npu: no NPU here
    torch.npu = types.SimpleNamespace(device_count=_no_npu)  # type: ignore[attr-defined]
    from mindspeed_mm.tools.feature_extraction import get_wan_feature

    del torch.npu
    classes = {
        "T2VDataset": t2v_dataset.T2VDataset,
        "I2VDataset": i2v_dataset.I2VDataset,
        "WanTextVideoDataset": get_wan_feature.WanTextVideoDataset,
    }
    files = {name: sys.modules[cls.__module__].__file__ for name, cls in classes.items()}
    cases = {}
    for case in SPEC["cases"]:
        try:
            cases[case["name"]] = KINDS[case["kind"]](case, classes)
        except Exception:
            cases[case["name"]] = {"error": traceback.format_exc()}
    return {"cases": cases, "used": sorted(set(USED)), "files": files}


def _dataset_param(path: str) -> dict[str, Any]:
    param = copy.deepcopy(json.loads(Path(path).read_text())["dataset_param"])
    param["use_text_processer"] = False  # no tokenizer weights here; the text is read all the same
    param.pop("tokenizer_config", None)
    return param  # type: ignore[no-any-return]


class _Recorder:
    """Stands where the reader calls its video processor: keeps what the reader passed, returns zeros."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def __call__(self, vframes: Any, **sample: Any) -> Any:
        import torch

        self.seen = {"frames": int(vframes.get_len()), "keys": sorted(sample)}
        return torch.zeros(3, 5, 8, 8)


def _clips(case: dict[str, Any], classes: dict[str, Any]) -> dict[str, Any]:
    ARGS.global_batch_size = case.get("global_batch_size", 1)
    param = _dataset_param(case["data_config"])
    cls = classes[case["reader"]]
    basic, pre = param["basic_parameters"], param["preprocess_parameters"]
    if case["reader"] == "WanTextVideoDataset":
        dataset = cls(case["task"], basic, pre, **param)
    else:
        dataset = cls(basic, pre, **param)
    keys = ("path", "cap", "file", "captions")
    out: dict[str, Any] = {
        "len": len(dataset),
        "samples": [{k: s.get(k) for k in keys if k in s} for s in dataset.data_samples],
    }
    recorder = _Recorder()
    dataset.video_processer = recorder
    item = dataset[0] if case["reader"] == "WanTextVideoDataset" else dataset.getitem(0)
    wan = case["reader"] == "WanTextVideoDataset"  # (T2VDataset keeps text only as token ids, off here)
    out["item"] = {"file": item.get("file"), "text": item.get("text") if wan else None, **recorder.seen}
    return out


def _mllm(case: dict[str, Any], classes: dict[str, Any]) -> dict[str, Any]:
    convert = importlib.import_module(case["convert"])
    param = json.loads(Path(case["data_config"]).read_text())["dataset_param"]
    basic = param["basic_parameters"]
    attr = convert.DatasetAttr(**param["attr"])
    data_args = convert.DataArguments(dataset_dir=basic["dataset_dir"], dataset=basic["dataset"])
    converter = convert.get_dataset_converter(attr.formatting, attr, data_args)
    records = json.loads(Path(case["dataset"]).read_text())
    rows = []
    for record in records:
        example = converter(record)
        rows.append(
            {
                "prompt": example["_prompt"],
                "response": example["_response"],
                "media": (example["_images"] or []) + (example["_videos"] or []),
            }
        )
    return {"rows": rows, "file": convert.__file__}


def _cogvideox_clips(case: dict[str, Any], classes: dict[str, Any]) -> dict[str, Any]:
    from mindspeed_mm.data.data_utils.video_processor import VideoProcessor
    from mindspeed_mm.data.data_utils.video_reader import VideoReader

    pre = dict(json.loads(Path(case["data_config"]).read_text())["dataset_param"]["preprocess_parameters"])
    for key in ("cfg", "image_processer_type", "use_aesthetic", "video_reader_type", "image_reader_type"):
        pre.pop(key, None)  # what T2VDataset.__init__ pops before VideoProcessor.create(**rest)
    processor = VideoProcessor.create(**pre)
    outcomes = {}
    for clip in case["clips"]:
        try:
            processor(VideoReader(video_reader_type="DecordVideo")(clip))
            outcomes[clip] = "passed"
        except Exception as exc:
            frames = [
                f
                for f in traceback.extract_tb(exc.__traceback__)
                if f.filename.endswith("video_processor.py")
            ]
            where = frames[-1].name if frames else "?"
            passed = where == "_resize_for_rectangle_crop"  # every temporal decision is behind it
            outcomes[clip] = "passed" if passed else f"fails in {where}: {type(exc).__name__}: {exc}"
    return {"outcomes": outcomes, "processor": type(processor).__name__}


def _sampler(case: dict[str, Any], classes: dict[str, Any]) -> dict[str, Any]:
    import torch
    from mindspeed_mm.data.dataloader import dataloader, sampler

    random.seed(0)  # (Megatron seeds it in a real run; padding picks with random.choice)
    n, world, mbs, loader = case["samples"], case["world"], case["mbs"], case["loader"]
    kind = loader.get("sampler_type", "stateful_distributed_sampler")
    drop_last, shuffle = bool(loader.get("drop_last", False)), bool(loader.get("shuffle", False))
    group = bool(loader.get("group_data") or loader.get("group_frame") or loader.get("group_resolution"))
    ranks: list[list[list[int]]] = []  # per rank, the samples of each step
    for rank in range(world):
        if kind == "SequentialSampler":  # build_sequential_loader: one global batch of mbs x world, sliced
            batches = dataloader.DistributedBatchSampler(
                torch.utils.data.SequentialSampler(range(n)), mbs * world, drop_last, rank, world
            )
            ranks.append([list(batch) for batch in batches])
            continue
        if kind == "LengthGroupedSampler" and group:
            order = list(
                sampler.LengthGroupedSampler(
                    mbs,
                    world_size=world,
                    num_replicas=world,
                    rank=rank,
                    shuffle=shuffle,
                    gradient_accumulation_size=1,
                    lengths=["1x8x8"] * n,  # one sample size: every clip in one group
                    group_frame=bool(loader.get("group_frame")),
                    group_resolution=bool(loader.get("group_resolution")),
                    group_data=bool(loader.get("group_data")),
                )
            )
        else:  # stateful_distributed_sampler, and LengthGroupedSampler without grouping (its fallback)
            order = list(
                sampler.StatefulDistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle)
            )
        steps = [order[i : i + mbs] for i in range(0, len(order), mbs)]  # the DataLoader's batches
        ranks.append([step for step in steps if len(step) == mbs or not drop_last])
    return {"ranks": ranks}


KINDS = {"clips": _clips, "mllm": _mllm, "cogvideox_clips": _cogvideox_clips, "sampler": _sampler}


if __name__ == "__main__":
    try:
        outcome: dict[str, Any] = main()
    except Exception:
        outcome = {"error": traceback.format_exc()}
    Path(SPEC["out"]).write_text(json.dumps(outcome))
