"""Child process (one per data-parallel rank, under torchrun): MindSpeed-MM's own data code reads extracted features.

Usage: `python -m torch.distributed.run --nproc_per_node DP upstream_features.py SPEC_JSON`. SPEC holds `versions`
(`{"name", "mm", "mindspeed"}`: the trees, judged one after the other in the same process, MindSpeed-MM and
MindSpeed modules dropped between them), `megatron` (the Megatron-LM tree), `data_config` (the rendered feature_data.json, as written), `extract_config`
(the rendered feature_extract/data.json: its tokenizer and text preprocessing), `micro_batch_size`,
`global_batch_size`, `seed`, `model_config` (the rendered model_t2v.json, as `args.mm.model`), `out` (a folder for this rank's JSON result) and `stripped` (a data.jsonl without the
fields MindSpeed-MM's video processor adds, as the runtime wrote it before).

On each rank, exactly as `pretrain_sora.py`'s `train_valid_test_datasets_provider` does on an NPU: Megatron's
`parallel_state` (real, on gloo) gives the data-parallel group; `build_mm_dataset` builds MindSpeed-MM's
`FeatureDataset`; `build_mm_dataloader` builds the `LengthGroupedSampler` loader from the rendered
`dataloader_param` (group_data ...) with the batch size, workers and seed from the arguments; `build_iterations`
makes the cyclic iterator the training loop draws from. The rank then reads every item of the dataset, draws one
epoch of micro batches, tokenises every caption with MindSpeed-MM's `Tokenizer` + `TextProcesser` (what its
extraction stores as `prompt_mask`), and builds the same loader over `stripped` to record the error MindSpeed-MM
raises there.

Stubbed by an import hook, and only these: `torch_npu`, `torchair`, `acl`, `tbe`, `mindspeed.op_builder` (NPU-only);
`megatron.training`'s package `__init__` (it imports the whole training stack; `get_args` returns this run's
arguments, `print_rank_0` prints); `mindspeed_mm.models.ae` (the VAE model stack, imported by
`mindspeed_mm/data/__init__.py` for `build_ae_dataset` only); transformers' Qwen2-VL image processor (needs
torchvision; imported by the Qwen2-VL bucket manager only); and any other third-party module that MindSpeed-MM's
or MindSpeed's own files import and this environment lacks (torchvision, pandas, ftfy, bs4, pandarallel,
sentencepiece, datasets, scipy, orjson: `used` in the result lists which). Of those, the feature path calls one: `orjson.loads`
(DataFileReader reads data.jsonl with it), provided here by `json.loads`. Everything else runs as written.
`NON_MEGATRON=true` (MindSpeed-MM's own switch) skips the training-argument patches `mindspeed_mm/__init__.py`
applies. Writes `<out>/rank<r>.json`: `{"rank", "versions": {name: result}, "used"}`.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from stubs import Missing, StubModule, matches  # a sibling module: this script's folder is on sys.path

SPEC = json.loads(Path(sys.argv[1]).read_text())
ROOTS = tuple(str(Path(v[k]).resolve()) for v in SPEC["versions"] for k in ("mm", "mindspeed"))
NPU_ONLY = ("torch_npu", "torchair", "acl", "tbe", "mindspeed.op_builder")
OFF_PATH = (
    "mindspeed_mm.models.ae",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl",
)
ARGS = argparse.Namespace(
    micro_batch_size=SPEC["micro_batch_size"],
    global_batch_size=SPEC["global_batch_size"],
    num_workers=SPEC["num_workers"],
    seed=SPEC["seed"],
    mm=argparse.Namespace(model=argparse.Namespace(**json.loads(Path(SPEC["model_config"]).read_text()))),
)
USED: list[str] = []


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on the path: NPU-only modules, megatron.training's package init, modules off the feature path."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if matches(name, NPU_ONLY + OFF_PATH) or name == "megatron.training":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        if spec.name == "megatron.training":  # the real submodules stay importable
            module.__path__ = [str(Path(SPEC["megatron"]) / "megatron" / "training")]
            module.get_args = lambda: ARGS  # type: ignore[attr-defined]
            module.print_rank_0 = lambda message: print(message, flush=True)  # type: ignore[attr-defined]
        if spec.name == "orjson":
            module.loads = json.loads  # type: ignore[attr-defined]
            module.dumps = lambda obj: json.dumps(obj).encode()  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _install() -> None:
    os.environ["NON_MEGATRON"] = "true"
    sys.path.insert(0, SPEC["megatron"])
    # transformers settles what it has (no torchvision here) before any stub exists.
    import transformers  # noqa: F401
    from transformers import AutoProcessor, DataCollatorForLanguageModeling, WhisperProcessor  # noqa: F401
    from transformers.trainer_pt_utils import LabelSmoother  # noqa: F401

    sys.meta_path.insert(0, _Stubs())
    sys.meta_path.append(Missing(ROOTS, _Stubs(), USED))


def _describe(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    return type(value).__name__


def _use(version: dict[str, str]) -> None:
    """Put this version's MindSpeed-MM and MindSpeed first on the path, dropping the previous version's modules."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("mindspeed_mm", "mindspeed")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p not in PUT]
    PUT[:] = [str(Path(version["mm"]).resolve()), version["mindspeed"]]
    sys.path[:0] = PUT
    importlib.invalidate_caches()


PUT: list[str] = []


def main() -> dict[str, Any]:
    _install()
    import torch.distributed as dist

    dist.init_process_group("gloo")
    from megatron.core import parallel_state as mpu

    mpu.initialize_model_parallel(1, 1)
    results = {}
    for version in SPEC["versions"]:
        _use(version)
        results[version["name"]] = judge(mpu)
    return {"rank": dist.get_rank(), "versions": results, "used": sorted(set(USED))}


def judge(mpu: Any) -> dict[str, Any]:
    import torch
    from mindspeed_mm.data import build_mm_dataloader, build_mm_dataset
    from mindspeed_mm.data.data_utils.utils import TextProcesser, build_iterations
    from mindspeed_mm.models.text_encoder import Tokenizer

    data = json.loads(Path(SPEC["data_config"]).read_text())
    stripped = json.loads(Path(SPEC["data_config"]).read_text())  # build_mm_dataloader pops from its dict
    extract = json.loads(Path(SPEC["extract_config"]).read_text())["dataset_param"]
    stock = _stock_index(build_mm_dataset, json.loads(json.dumps(extract)))
    generator = torch.Generator()
    generator.manual_seed(ARGS.seed)
    dataset = build_mm_dataset(data["dataset_param"])
    loader = build_mm_dataloader(
        dataset,
        data["dataloader_param"],
        process_group=mpu.get_data_parallel_group(),
        consumed_samples=0,
        dataset_param=data["dataset_param"],
        generator=generator,
    )
    iterator, _, _ = build_iterations(train_dl=loader)
    batches = [{k: _describe(v) for k, v in next(iterator).items()} for _ in range(len(loader))]
    items = [{k: _describe(v) for k, v in dataset[i].items()} for i in range(len(dataset))]

    texts = TextProcesser(
        tokenizer=Tokenizer(extract["tokenizer_config"]).get_tokenizer(),
        enable_text_preprocessing=extract.get("enable_text_preprocessing", True),
        text_preprocess_methods=extract.get("text_preprocess_methods"),
        cfg=extract["preprocess_parameters"].get("cfg", 0.1),
    )
    masks = []
    for sample in dataset.data_samples:
        _, mask = texts([sample["cap"]])
        masks.append({"shape": list(mask.shape), "dtype": str(mask.dtype), "values": mask.tolist()})

    stripped["dataset_param"]["basic_parameters"]["data_path"] = SPEC["stripped"]
    try:
        old = build_mm_dataset(stripped["dataset_param"])
        build_mm_dataloader(
            old,
            stripped["dataloader_param"],
            process_group=mpu.get_data_parallel_group(),
            dataset_param=stripped["dataset_param"],
        )
        before = None
    except Exception as exc:  # what MindSpeed-MM raises on the old index
        before = f"{type(exc).__name__}: {exc}"
    return {
        "file": sys.modules["mindspeed_mm.data"].__file__,
        "dp": mpu.get_data_parallel_world_size(),
        "classes": sorted(
            {type(dataset).__qualname__, type(loader.sampler).__qualname__, type(loader).__qualname__}
        ),
        "modules": sorted({type(dataset).__module__, type(loader.sampler).__module__}),
        "records": [dict(s) for s in dataset.data_samples],
        "items": items,
        "batches": batches,
        "masks": masks,
        "before": before,
        "stock": stock,
    }


def _stock_index(build_mm_dataset: Any, dataset_param: dict[str, Any]) -> list[dict[str, Any]]:
    """The records MindSpeed-MM's own extraction would write for the same clips, from the rendered extraction config.

    `get_wan_feature.py` writes `dataset.data_samples` of its `WanTextVideoDataset`, a `T2VDataset` whose video
    processor annotates (and filters) the raw records; `build_mm_dataset` builds that `T2VDataset` here. Its last
    filter drops every `sample_size` group smaller than 4 x global batch size: run with a global batch size of 1
    so every group stays (the runtime keeps them all).
    """
    ARGS.global_batch_size = 1
    try:
        return [dict(s) for s in build_mm_dataset(dataset_param).data_samples]
    finally:
        ARGS.global_batch_size = SPEC["global_batch_size"]


if __name__ == "__main__":
    rank = os.environ.get("RANK", "0")
    try:
        result: dict[str, Any] = main()
    except Exception:
        result = {"rank": int(rank), "error": traceback.format_exc()}
    Path(SPEC["out"], f"rank{rank}.json").write_text(json.dumps(result))
