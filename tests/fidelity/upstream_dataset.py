"""Child process: MindSpeed-MM's own raw-dataset code reads an index and decides which clips it trains on.

Usage: `python upstream_dataset.py SPEC_JSON`, one process per MindSpeed-MM tree. SPEC holds `mm` (the MindSpeed-MM
tree), `mindspeed` (the MindSpeed tree its `mindspeed_mm.utils` imports), `megatron` (the Megatron-LM tree), `out`
(the JSON result file) and `cases`: each `{"name", "data_txt", "data_config", "micro_batch_size",
"global_batch_size", "read"}`, all judged in this one process (imports dominate the time, a case takes
milliseconds). Per case, as `T2VDataset.__init__` does it:

1. `DataFileReader(data_storage_mode="combine")(data_txt)`: the `root,json` lines, each record's `path` joined onto
   its root.
2. With `data_config` (a dataset config with `preprocess_parameters`): the keys `T2VDataset` pops off
   `preprocess_parameters` removed, the processor built by `VideoProcessor.create(**rest)` with `get_args()` giving
   the case's micro/global batch size, and `select_valid_data(samples)` run. Its `DataStats` counters are recorded
   (a subclass that only keeps a reference to each instance replaces the module's name for the call).
3. With `read`: every record's `path` opened by `VideoReader(video_reader_type="DecordVideo")`, the real decord.

Stubbed by an import hook, and only these: `torch_npu`, `torchair`, `acl`, `tbe`, `mindspeed.op_builder`
(NPU-only); `megatron.training`'s and `mindspeed_mm.data`'s package `__init__` (the first imports the whole training
stack, the second every dataset class and the VAE stack; their submodules stay real; `get_args` returns the case's
arguments); any other third-party module MindSpeed-MM's or MindSpeed's own files import and this environment lacks
(torchvision, pandas, ftfy, bs4, orjson...: `used` in the result lists which). Of those the dataset path calls two:
`orjson.loads` (JsonLoader, provided by `json.loads`) and torchvision's `IMG_EXTENSIONS` (the image branch of the
temporal step; torchvision's value). Megatron's `parallel_state` is real, one rank on gloo, so the context-parallel
size the processor truncates frames by is 1. `NON_MEGATRON=true` (MindSpeed-MM's own switch) skips the
training-argument patches `mindspeed_mm/__init__.py` applies.

Writes `out`: `{"file", "cases": {name: {"paths", "valid", "counters", "error", "reads"}}, "used"}` (`paths`: as
DataFileReader joined them; `valid`: the kept records' path, frame plan and resolution), or
`{"error": traceback}` when MindSpeed-MM's code does not even import.
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
ROOTS = tuple(str(Path(SPEC[k]).resolve()) for k in ("mm", "mindspeed"))
NPU_ONLY = ("torch_npu", "torchair", "acl", "tbe", "mindspeed.op_builder")
# Package inits skipped, submodules kept: name -> the package's real folder.
INIT_ONLY = {
    "megatron.training": Path(SPEC["megatron"]) / "megatron" / "training",
    "mindspeed_mm.data": Path(ROOTS[0]) / "mindspeed_mm" / "data",
}
# torchvision.datasets.folder.IMG_EXTENSIONS, torchvision's own value.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# What T2VDataset.__init__ pops off preprocess_parameters before VideoProcessor.create(**rest).
T2V_POPS = ("cfg", "image_processer_type", "use_aesthetic", "video_reader_type", "image_reader_type")
ARGS = argparse.Namespace(
    micro_batch_size=1, global_batch_size=1, mm=argparse.Namespace(model=argparse.Namespace())
)
USED: list[str] = []


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on the path: NPU-only modules and the two heavy package inits."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if matches(name, NPU_ONLY) or name in INIT_ONLY:
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


def _install() -> None:
    os.environ["NON_MEGATRON"] = "true"
    sys.path[:0] = [ROOTS[0], ROOTS[1], SPEC["megatron"]]
    # transformers settles what it has (no torchvision here) before any stub exists.
    import transformers  # noqa: F401
    from transformers.trainer_pt_utils import LabelSmoother  # noqa: F401

    sys.meta_path.insert(0, _Stubs())
    sys.meta_path.append(Missing(ROOTS, _Stubs(), USED))


def main() -> dict[str, Any]:
    _install()
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    from mindspeed_mm.data.data_utils import video_processor

    cases = {case["name"]: judge(case) for case in SPEC["cases"]}
    return {"file": video_processor.__file__, "cases": cases, "used": sorted(set(USED))}


def judge(case: dict[str, Any]) -> dict[str, Any]:
    from mindspeed_mm.data.data_utils.utils import DataFileReader

    ARGS.micro_batch_size = case["micro_batch_size"]
    ARGS.global_batch_size = case["global_batch_size"]
    result: dict[str, Any] = {"error": None}
    try:
        samples = DataFileReader(data_storage_mode="combine")(case["data_txt"])
    except Exception:
        result["error"] = traceback.format_exc()
        return result
    result["paths"] = [s["path"] for s in samples]
    if case.get("read"):
        result["reads"] = [_read(s["path"]) for s in samples]
    if case.get("data_config"):
        result.update(_select(samples, case["data_config"]))
    return result


def _select(samples: list[dict[str, Any]], data_config: str) -> dict[str, Any]:
    from mindspeed_mm.data.data_utils import video_processor

    made: list[Any] = []

    class _Kept(video_processor.DataStats):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    params = dict(json.loads(Path(data_config).read_text())["dataset_param"]["preprocess_parameters"])
    for key in T2V_POPS:
        params.pop(key, None)
    original = video_processor.DataStats
    video_processor.DataStats = _Kept
    out: dict[str, Any] = {"valid": None, "counters": {}}
    try:
        processor = video_processor.VideoProcessor.create(**params)
        valid = processor.select_valid_data(samples)
        out["valid"] = [
            {
                k: s.get(k)
                for k in ("path", "num_frames", "sample_num_frames", "sample_size", "start_frame_idx")
            }
            | {"resolution": s.get("resolution")}
            for s in valid
        ]
    except Exception:
        out["error"] = traceback.format_exc()
    finally:
        video_processor.DataStats = original
    if made:
        out["counters"] = dict(made[-1].counters)
    return out


def _read(path: str) -> dict[str, Any]:
    from mindspeed_mm.data.data_utils.video_reader import VideoReader

    found: dict[str, Any] = {"path": path, "exists": os.path.isfile(path)}
    try:
        video = VideoReader(video_reader_type="DecordVideo")(path)
        found.update(len=video.get_len(), fps=video.get_video_fps())
    except Exception as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"
    return found


if __name__ == "__main__":
    try:
        outcome: dict[str, Any] = main()
    except Exception:
        outcome = {"error": traceback.format_exc()}
    Path(SPEC["out"]).write_text(json.dumps(outcome))
