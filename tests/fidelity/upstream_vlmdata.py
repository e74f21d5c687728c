"""Child process: MindSpeed-MM's own MLLM preprocessing for Qwen2.5-VL, on CPU, over a data config and its records.

Usage: `python upstream_vlmdata.py SPEC_JSON`. SPEC holds `mm`, `mindspeed`, `megatron` (the trees), `out` (a
folder for the result), and `cases`, each `{"name", "data_config", "base", "seq_length", "batches"}`: the data
config's `dataset_param` goes to MindSpeed-MM's `get_qwen2vl_dataset(basic, preprocess, dataset_param)` (the
function `build_mm_dataset` calls for `dataset_type: huggingface`), run in `base` (the job's working directory:
relative paths start there) with `args.seq_length` = `seq_length`; then each batch (a list of sample indices) goes
through `DataCollatorForQwen2vl(dataset_param=…, **collate_param)` (what `build_mm_dataloader` builds from
`collate_param.model_name: qwen2vl`). Everything from the record converter to the collator's tensors is
MindSpeed-MM's code: `align_dataset` + `SharegptDatasetConverter`, `load_tokenizer`, the `qwen2vl` template,
`Qwen2VLPlugin` (image regularisation, placeholder expansion, the image processor), `SupervisedDatasetProcessor`,
`MultiModalDataCollatorForSeq2Seq` over transformers' `DataCollatorForSeq2Seq`.

What differs, because of this machine:
- `datasets` is not installed: `load_dataset(path="json", data_files=…)` is answered by `_JsonRows`, the records
  of the JSON (list or lines) files in order, every record given every key any record has (missing ones None, as
  Arrow's schema does), with the `map` (`batched`, `batch_size`, `remove_columns`), `select` and `skip` that
  `get_qwen2vl_dataset` and `align_dataset` call. The mapped functions are MindSpeed-MM's.
- transformers ≥ 5 cannot build a `Qwen2_5_VLProcessor` without torchvision (its video processor needs it), so
  `load_tokenizer`'s `AutoProcessor.from_pretrained` would fall to `processor = None`. When the real call fails for
  that reason, a `Qwen2_5_VLProcessor` is assembled from the parts `AutoProcessor` would load (`AutoImageProcessor`
  with the same `use_fast`, `AutoTokenizer`), its video processor the image processor (present for
  `_validate_input`; no record here has a video). `load_tokenizer` then sets its own tokenizer and pixel limits on
  it as usual. Recorded in `used`.
- `dataset_param` is MindSpeed-MM's `ConfigJson` in a real run (`mindspeed_mm.configs.config`, stubbed here): the
  collator reads `dataset_param.preprocess_parameters.to_dict()` and `dataset_param.basic_parameters.template`,
  which `_Config` answers from the same JSON.

Stubbed by the import hook of `upstream_readers.py` (see stubs.py): NPU-only modules, `megatron.training`'s and
`mindspeed_mm.data`'s `__init__` (their submodules stay real; `get_args` answers `seq_length`,
`consumed_train_samples`), and any third-party module MindSpeed-MM's files import that this environment lacks.
Writes `out/result.json` (`{"cases": {name: {"items": [...], "batches": [...]}}, "used", "files"}` or
`{"error"}`) and `out/<case>-<batch>.pt` (the batch's tensors).
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
MM = Path(SPEC["mm"]).resolve()
ROOTS = (str(MM), str(Path(SPEC["mindspeed"]).resolve()))
OUT = Path(SPEC["out"]).resolve()
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
    "mindspeed_mm.data.dataloader.bucket_manager",
)
_DATA = MM / "mindspeed_mm"
INIT_ONLY = {
    "megatron.training": Path(SPEC["megatron"]) / "megatron" / "training",
    "mindspeed_mm.data": _DATA / "data",
}
ARGS = argparse.Namespace(seq_length=1024, consumed_train_samples=0, micro_batch_size=1, global_batch_size=1)
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
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _JsonRows:
    """What `get_qwen2vl_dataset` and `align_dataset` use of a `datasets.Dataset` loaded from JSON files."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        keys: dict[str, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        self.rows = [{key: row.get(key) for key in keys} for row in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def select(self, indices: Any) -> _JsonRows:
        return _JsonRows([self.rows[i] for i in indices])

    def skip(self, n: int) -> _JsonRows:
        return _JsonRows(self.rows[n:])

    def map(
        self,
        function: Any,
        batched: bool = False,
        batch_size: int = 1000,
        remove_columns: Any = None,
        **_: Any,
    ) -> _JsonRows:
        drop = set(remove_columns or ())
        out: list[dict[str, Any]] = []
        if not batched:
            for row in self.rows:
                kept = {k: v for k, v in row.items() if k not in drop}
                out.append({**kept, **function(dict(row))})
            return _JsonRows(out)
        for start in range(0, len(self.rows), batch_size or len(self.rows) or 1):
            chunk = self.rows[start : start + (batch_size or len(self.rows))]
            batch = {key: [row[key] for row in chunk] for key in chunk[0]}
            result = function(batch)
            count = len(next(iter(result.values()))) if result else 0
            kept = {k: v for k, v in batch.items() if k not in drop and len(v) == count}
            columns = {**kept, **result}
            out.extend({key: values[i] for key, values in columns.items()} for i in range(count))
        return _JsonRows(out)


def _load_dataset(path: str, data_files: Any, split: str = "train", **_: Any) -> _JsonRows:
    if path != "json" or split != "train":
        raise ValueError(f"only load_dataset('json', split='train') is answered here, not {path!r}/{split!r}")
    rows: list[dict[str, Any]] = []
    for name in [data_files] if isinstance(data_files, str) else data_files:
        text = Path(name).read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            rows.extend(json.loads(text))
        else:
            rows.extend(json.loads(line) for line in text.splitlines() if line.strip())
    return _JsonRows(rows)


def _processor_fallback() -> None:
    """`AutoProcessor.from_pretrained` as it answers with torchvision: the real one, else its image parts."""
    import transformers

    real = transformers.AutoProcessor.from_pretrained

    def from_pretrained(path: str, **kwargs: Any) -> Any:
        try:
            return real(path, **kwargs)
        except ImportError as exc:
            if "orchvision" not in str(exc):
                raise
        USED.append("Qwen2_5_VLProcessor assembled from AutoImageProcessor + AutoTokenizer (no torchvision)")
        processor = transformers.Qwen2_5_VLProcessor.__new__(transformers.Qwen2_5_VLProcessor)
        image = transformers.AutoImageProcessor.from_pretrained(
            path, use_fast=kwargs.get("use_fast"), local_files_only=True
        )
        processor.image_processor = image
        processor.video_processor = image
        processor.tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        return processor

    transformers.AutoProcessor.from_pretrained = from_pretrained  # type: ignore[method-assign,assignment]


class _Config:
    """`ConfigJson`'s attribute access and `to_dict` over a JSON object."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        return _Config(value) if isinstance(value, dict) else value

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)


def _install() -> None:
    os.environ["NON_MEGATRON"] = "true"
    sys.path[:0] = [ROOTS[0], ROOTS[1], SPEC["megatron"]]
    import transformers  # noqa: F401  (settles what it has before any stub exists)
    from transformers.trainer_pt_utils import LabelSmoother  # noqa: F401

    datasets = types.ModuleType("datasets")
    datasets.load_dataset = _load_dataset  # type: ignore[attr-defined]
    sys.modules["datasets"] = datasets
    USED.append("datasets.load_dataset('json') answered by _JsonRows")
    _processor_fallback()
    sys.meta_path.insert(0, _Stubs())
    sys.meta_path.append(Missing(ROOTS, _Stubs(), USED))


def _case(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from mindspeed_mm.data.dataloader.data_collator import DATA_COLLATOR
    from mindspeed_mm.data.datasets.qwen2vl_dataset import get_qwen2vl_dataset

    cfg = json.loads(Path(case["data_config"]).read_text())
    param = cfg["dataset_param"]
    ARGS.seq_length = case["seq_length"]
    here = Path.cwd()
    os.chdir(case["base"])
    try:
        dataset = get_qwen2vl_dataset(
            dict(param["basic_parameters"]),
            dict(param["preprocess_parameters"]),
            json.loads(json.dumps(param)),
        )
        collate = dict(cfg["dataloader_param"]["collate_param"])
        collator = DATA_COLLATOR[collate.pop("model_name")](dataset_param=_Config(param), **collate)
        items = [
            {k: dataset[i][k] for k in ("input_ids", "attention_mask", "labels", "images")}
            for i in range(len(dataset))
        ]
        batches = []
        for b, indices in enumerate(case["batches"]):
            features = [json.loads(json.dumps(dataset[i])) for i in indices]  # the collator pops from them
            batch = collator(features)
            tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            torch.save(tensors, OUT / f"{case['name']}-{b}.pt")
            batches.append({"keys": sorted(batch), "file": f"{case['name']}-{b}.pt"})
    finally:
        os.chdir(here)
    return {"items": items, "batches": batches}


def main() -> dict[str, Any]:
    _install()
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    cases = {}
    for case in SPEC["cases"]:
        try:
            cases[case["name"]] = _case(case)
        except Exception:
            cases[case["name"]] = {"error": traceback.format_exc()}
    from mindspeed_mm.data.datasets import qwen2vl_dataset

    return {"cases": cases, "used": sorted(set(USED)), "files": [qwen2vl_dataset.__file__]}


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        outcome: dict[str, Any] = main()
    except Exception:
        outcome = {"error": traceback.format_exc()}
    (OUT / "result.json").write_text(json.dumps(outcome))
