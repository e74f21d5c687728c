"""Child process: MindSpeed-MM's own code accepts a model that `scaffold_model` wrote into a copy of its tree.

Usage: `python upstream_scaffold.py SPEC_JSON`, one process per MindSpeed-MM version. SPEC holds `mm` (the writable
copy of the tree the scaffold wrote into), `mindspeed`, `megatron` (the trees before it on `sys.path`), `out` (the
JSON result), `name` (the model id), `dit` (`module:Class` of the scaffolded DiT), `entry` (the scaffolded
`pretrain_{name}.py`, relative to `mm`), `argv` (what `examples/{name}/pretrain.sh` hands torchrun after the entry),
`world_size`, and `launches` (`{"label", "entry", "argv", "world_size"}`: more launches, for the parser alone).
In this order, each check recorded apart (a later one runs when it can, so one failure does not hide the rest):

- `parser`: the launch's argv through the parser MindSpeed-MM really builds and its `validate_args`
  (`mm_agent/validate/mmparser_child.py` `judge`: Megatron + MindSpeed + MindSpeed-MM, the `--mm-*` JSONs merged
  into `args.mm` by MindSpeed-MM's `merge_mm_args` / `MMConfig`), then parsed again to keep those arguments (what
  `get_args()` answers from here on);
- `registry`: `mindspeed_mm.models.predictor.predict_model.PREDICTOR_MODEL_MAPPINGS[name]` is the class of the
  scaffolded DiT file;
- `configs`: `args.mm.model` / `args.mm.data` are MindSpeed-MM's `ConfigReader`s (as `merge_mm_args` read
  model.json and data.json) and `PredictModel(args.mm.model.predictor)` builds the scaffolded DiT;
- `dataset`: the entry's own `train_valid_test_datasets_provider` (its dataset class over
  `data_config.dataset_param.to_dict()`, MindSpeed-MM's `build_mm_dataloader` and `build_iterations`) yields a
  batch: its tensors' shapes, dtypes and value range are recorded;
- `model`: the entry's own `model_provider` builds the scaffolded model (MindSpeed-MM's AEModel, TextEncoder and
  DiffusionModel over the weights model.json names, and `PredictModel`): the classes of its parts are recorded;
- `fsdp`: the scaffolded fsdp2_config.yaml read by MindSpeed-MM's `Fsdp2Config.load_from_yaml`, and each of its
  `sub_modules_to_wrap`, `recompute_modules` and `ignored_modules` paths resolved on that model by MindSpeed-MM's
  `get_submodules_by_path` (what it prints, "Warning: Module not found ...", recorded);
- `train`: the model's own `fully_shard` with the launch's --fsdp2-config-path (as MindSpeed's FSDP2 wrapper calls
  it: blocks wrapped and recomputed, the root's mixed-precision policy casting the batch to bf16, the VAE and text
  encoder ignored), then the entry's `forward_step` on the batch, its `loss_func`, and a backward: the loss, and
  which predictor parameters got no gradient, a non-finite one, or which frozen parameter got one.

Stand-ins are `upstream_load.py`'s (imported as a module: it reads the same SPEC keys `mm`, `mindspeed`,
`megatron`), with three of its off-path modules put back because this check runs them: `mindspeed_mm.data`'s
package `__init__` (it holds `build_mm_dataloader`), `mindspeed_mm.data.dataloader` and `mindspeed_mm.models.ae`.
Besides those: the entry's `get_batch` moves tensors to `torch.cuda.current_device()`, which torch_npu's
`transfer_to_npu` answers on an NPU and which here answers the CPU; `megatron.training.utils` (a stand-in there)
gets `unwrap_model` (a model that no Megatron wrapper wraps is returned as is, as Megatron's does) and
`average_losses_across_data_parallel_group` (Megatron's: the losses all-reduced over the data-parallel group and
divided by its size); `ftfy` where it is not installed is a module whose `fix_text` returns its text (what ftfy
returns for the plain ASCII captions the test writes; TextProcesser's `basic_clean` calls it); `--num-workers` is
set to 0 after validation (the loader's worker processes would re-import all of this per worker; the batch is the
same). FSDP2 is real (`torch.distributed.fsdp.fully_shard` through the model's own `fully_shard`, on a one-rank
gloo group) with its device mesh built on "cpu" where MindSpeed-MM names "npu".
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
MM = str(Path(SPEC["mm"]).resolve())
OUT: dict[str, Any] = {"checks": {}, "stubbed": [], "skipped": []}
STATE: dict[str, Any] = {}
PARTS = ("ae", "text_encoder", "diffusion", "predictor")


def _record(name: str, **found: Any) -> dict[str, Any]:
    entry = {"ok": False, "error": None, **found}
    OUT["checks"][name] = entry
    return entry


def _failed(entry: dict[str, Any]) -> None:
    entry["ok"] = False
    entry["error"] = traceback.format_exc()[-3000:]


def _install() -> Any:
    """upstream_load's stand-ins, minus the three modules this check runs (see the module docstring)."""
    import importlib.machinery
    import importlib.util
    import types

    import upstream_load  # a sibling module: this script's folder is on sys.path

    if importlib.util.find_spec("ftfy") is None:  # TextProcesser's basic_clean calls ftfy.fix_text
        ftfy = types.ModuleType("ftfy")
        ftfy.__spec__ = importlib.machinery.ModuleSpec("ftfy", None)  # transformers asks find_spec("ftfy")
        vars(ftfy)["fix_text"] = lambda text, *args, **kwargs: text
        sys.modules["ftfy"] = ftfy
    kept = ("mindspeed_mm.data.dataloader", "mindspeed_mm.models.ae")
    upstream_load.OFF_PATH = tuple(p for p in upstream_load.OFF_PATH if p not in kept)
    child = upstream_load._install()
    # upstream_load leaves `mindspeed_mm.data`'s __init__ unrun; build_mm_dataloader lives there
    sys.modules.pop("mindspeed_mm.data", None)
    vars(sys.modules["mindspeed_mm"]).pop("data", None)
    utils = sys.modules["megatron.training.utils"]
    vars(utils)["unwrap_model"] = lambda model, *args, **kwargs: model
    vars(utils)["average_losses_across_data_parallel_group"] = _average_losses
    STATE["load"] = upstream_load
    return child


def _average_losses(losses: list[Any]) -> Any:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    group = parallel_state.get_data_parallel_group()
    dist.all_reduce(averaged, group=group)
    return averaged / dist.get_world_size(group=group)


def check_parser(child: Any) -> Any:
    """The launch through MindSpeed-MM's parser and validate_args; returns the validated arguments (or None)."""
    entry = _record("parser", argv=SPEC["argv"])
    job = {
        "id": SPEC["name"],
        "entry": SPEC["entry"],
        "argv": SPEC["argv"],
        "world_size": SPEC["world_size"],
        "cwd": MM,
        "kind": "megatron",
    }
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import mindspeed.megatron_adaptor  # noqa: F401  (the entry script's first import)
        parser = child.build_parser()
        validate, entry["validator"] = child._validator()
        entry["parser_options"] = len(parser._option_string_actions)
        others = {}
        for launch in SPEC.get("launches", []):  # judged by the parser only
            other = child.judge(parser, validate, {**job, **launch, "id": launch["label"]}, MM)
            others[launch["label"]] = {k: other[k] for k in ("ok", "stage", "error")}
        entry["launches"] = others
        verdict = child.judge(parser, validate, job, MM)
        os.environ["WORLD_SIZE"] = str(SPEC["world_size"])  # judge sets it per launch
        entry.update(ok=verdict["ok"], stage=verdict["stage"], error=verdict["error"])
        if not verdict["ok"]:
            return None
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = parser.parse_args(SPEC["argv"])
            args.rank, args.world_size = 0, SPEC["world_size"]
            validate(args, {})
    except Exception:
        _failed(entry)
        return None
    args.num_workers = 0
    return args


def _distributed(args: Any) -> None:
    import torch
    import torch.distributed as dist

    STATE["load"].ARGS["args"] = args
    import megatron.training.global_vars as global_vars

    global_vars._GLOBAL_ARGS = args
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    # what torch_npu's transfer_to_npu answers on an NPU (the entry's get_batch moves tensors there)
    vars(torch.cuda)["current_device"] = lambda: "cpu"


def check_registry() -> Any:
    module_name, _, cls_name = SPEC["dit"].partition(":")
    entry = _record("registry", module=module_name, cls=cls_name)
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, cls_name)
        entry["file"] = module.__file__
        from mindspeed_mm.models.predictor import predict_model

        mapping = predict_model.PREDICTOR_MODEL_MAPPINGS
        entry["mapping_file"] = predict_model.__file__
        entry["registered"] = sorted(mapping)
        found = mapping.get(SPEC["name"])
        entry["found"] = None if found is None else f"{found.__module__}.{found.__qualname__}"
        entry["ok"] = found is cls
        if not entry["ok"]:
            entry["error"] = (
                f"PREDICTOR_MODEL_MAPPINGS[{SPEC['name']!r}] is {entry['found']}, not {SPEC['dit']}"
            )
        return cls
    except Exception:
        _failed(entry)
        return None


def check_configs(args: Any, cls: Any) -> None:
    entry = _record("configs")
    try:
        from mindspeed_mm.configs.config import ConfigReader
        from mindspeed_mm.models.predictor import PredictModel

        mm = args.mm
        entry["readers"] = {k: type(getattr(mm, k, None)).__name__ for k in ("model", "data", "tool")}
        if not all(isinstance(getattr(mm, k, None), ConfigReader) for k in ("model", "data")):
            entry["error"] = f"args.mm.model / args.mm.data are not ConfigReaders: {entry['readers']}"
            return
        entry["model_keys"] = sorted(mm.model.to_dict())
        entry["predictor_model_id"] = mm.model.predictor.model_id
        with contextlib.redirect_stdout(io.StringIO()):
            predictor = PredictModel(mm.model.predictor).get_model()
        entry["built"] = f"{type(predictor).__module__}.{type(predictor).__qualname__}"
        entry["parameters"] = sum(p.numel() for p in predictor.parameters())
        entry["ok"] = cls is not None and type(predictor) is cls
        if not entry["ok"]:
            entry["error"] = f"PredictModel built {entry['built']}, not {SPEC['dit']}"
    except Exception:
        _failed(entry)


def _tensor_summary(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        summary: dict[str, Any] = {
            "shape": list(value.shape),
            "dtype": str(value.dtype).replace("torch.", ""),
        }
        if value.numel() and (value.is_floating_point() or value.dtype in (torch.int64, torch.int32)):
            summary.update(min=float(value.min()), max=float(value.max()))
        return summary
    return type(value).__name__


def check_dataset(functions: dict[str, Any]) -> Any:
    entry = _record("dataset")
    try:
        provider = functions["train_valid_test_datasets_provider"]
        with contextlib.redirect_stdout(io.StringIO()):
            iterator, _, _ = provider([1, 0, 0])
            loader = _loader_of(iterator)
            batch = next(iterator)
        entry["loader"] = loader
        entry["batch"] = {k: _tensor_summary(v) for k, v in batch.items()}
        entry["ok"] = True
        return iterator, batch
    except Exception:
        _failed(entry)
        return None, None


def _loader_of(iterator: Any) -> dict[str, Any]:
    """The DataLoader behind build_iterations' generator (its frame's `dl`), described."""
    frame = getattr(iterator, "gi_frame", None)
    loader = frame.f_locals.get("dl") if frame is not None else None
    if loader is None:
        return {}
    return {
        "class": type(loader).__name__,
        "dataset": f"{type(loader.dataset).__module__}.{type(loader.dataset).__qualname__}",
        "dataset_file": sys.modules[type(loader.dataset).__module__].__file__,
        "sampler": type(loader.sampler).__name__,
        "batch_size": loader.batch_size,
        "length": len(loader.dataset),
    }


def build_model(functions: dict[str, Any]) -> Any:
    """The entry's own model_provider; its parts recorded under `model`."""
    entry = _record("model")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = functions["model_provider"]()
    except Exception:
        _failed(entry)
        return None
    entry["class"] = _name(type(model))
    entry["parts"] = {k: _name(type(getattr(model, k))) for k in PARTS if hasattr(model, k)}
    entry["ok"] = True
    return model


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_train(functions: dict[str, Any], model: Any, batch: Any) -> None:
    """FSDP2 as the launch asks for it, then one training step's forward and backward (see the docstring)."""
    import torch

    entry = _record("train")
    if model is None or batch is None:
        entry["error"] = "no model or no batch: an earlier check failed"
        return
    try:
        _fully_shard(model, entry)
        model.train()
        output, loss_func = functions["forward_step"](iter([dict(batch)]), model)
        loss, reported = loss_func(output)
        entry["output"] = _tensor_summary(output)
        entry["loss"] = float(loss.detach().float().mean())
        entry["reported"] = sorted(reported) if isinstance(reported, dict) else type(reported).__name__
        loss.mean().backward()
        params = dict(model.predictor.named_parameters())
        grads = {n: _local(p.grad) for n, p in params.items()}
        entry["predictor_parameters"] = len(params)
        entry["no_grad"] = sorted(n for n, g in grads.items() if g is None)
        entry["nonfinite_grad"] = sorted(
            n for n, g in grads.items() if g is not None and not torch.isfinite(g).all()
        )
        entry["zero_grad"] = sorted(n for n, g in grads.items() if g is not None and not g.any())
        entry["frozen_with_grad"] = sorted(
            f"{k}.{n}"
            for k in ("ae", "text_encoder")
            if hasattr(model, k)
            for n, p in getattr(model, k).named_parameters()
            if p.grad is not None
        )
        entry["ok"] = (
            math.isfinite(entry["loss"])
            and bool(params)
            and not entry["no_grad"]
            and not entry["nonfinite_grad"]
            and not entry["frozen_with_grad"]
        )
        if not entry["ok"]:
            entry["error"] = "loss not finite, or predictor parameters without a finite gradient"
    except Exception:
        _failed(entry)


def _local(grad: Any) -> Any:
    return grad.to_local() if grad is not None and hasattr(grad, "to_local") else grad


def _fully_shard(model: Any, entry: dict[str, Any]) -> None:
    """The model's own `fully_shard` (FSDP2Mixin) with the launch's --fsdp2-config-path, as MindSpeed's FSDP2
    wrapper calls it, over the data-parallel group; the device mesh MindSpeed-MM builds on "npu" is built on "cpu"
    (one rank: the yaml's sharding_size is recorded, a mesh of one is made)."""
    import mindspeed_mm.models.transformers.base_model as base_model
    from megatron.core import parallel_state
    from torch.distributed.device_mesh import DeviceMesh

    asked: list[Any] = []

    def cpu_mesh(sharding_size: Any, process_group: Any) -> Any:
        asked.append(sharding_size)
        return DeviceMesh.from_group(process_group, "cpu", mesh_dim_names=["Shard"])

    base_model._create_device_mesh = cpu_mesh
    path = STATE["args"].fsdp2_config_path
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        model.fully_shard(
            process_group=parallel_state.get_data_parallel_group(with_context_parallel=True),
            fsdp2_config_path=path,
        )
    entry["fsdp2"] = {
        "config": path,
        "sharding_size": asked[0] if asked else None,
        "mp_policy": str(model.fsdp2_kwargs.get("mp_policy")),
        "printed": [line for line in printed.getvalue().splitlines() if line.strip()][-5:],
    }


def check_fsdp(model: Any) -> None:
    entry = _record("fsdp")
    try:
        from mindspeed_mm.models.transformers.base_model import Fsdp2Config, get_submodules_by_path

        path = STATE["args"].fsdp2_config_path
        entry["config"] = path
        config = Fsdp2Config.load_from_yaml(os.path.join(MM, path))
        if model is None:
            entry["error"] = "no model: the model check failed"
            return
        resolved: dict[str, Any] = {}
        printed_all: list[str] = []
        for key in ("sub_modules_to_wrap", "recompute_modules", "ignored_modules"):
            for module_path in getattr(config, key) or []:
                printed = io.StringIO()
                try:
                    with contextlib.redirect_stdout(printed):
                        found = get_submodules_by_path(model, [module_path])
                    resolved[f"{key}:{module_path}"] = len(found or [])
                except Exception as exc:
                    resolved[f"{key}:{module_path}"] = f"{type(exc).__name__}: {exc}"
                printed_all += [line for line in printed.getvalue().splitlines() if line.strip()]
        entry["resolved"] = resolved
        entry["printed"] = printed_all
        entry["ok"] = bool(resolved) and all(isinstance(v, int) and v > 0 for v in resolved.values())
        entry["ok"] = entry["ok"] and not any("not found" in line for line in printed_all)
        if not entry["ok"]:
            entry["error"] = f"paths MindSpeed-MM does not resolve: {resolved}; printed: {printed_all}"
    except Exception:
        _failed(entry)


def main() -> None:
    os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    os.chdir(MM)
    child = _install()  # before sys.argv is the launch's: upstream_load reads its SPEC from sys.argv[1]
    sys.argv = [SPEC["entry"], *SPEC["argv"]]
    args = check_parser(child)
    if args is None:  # later checks still run on the configs as MindSpeed-MM reads them
        from mindspeed_mm.configs.config import merge_mm_args

        args = _fallback_args(merge_mm_args)
    STATE["args"] = args
    _distributed(args)
    cls = check_registry()
    check_configs(args, cls)
    functions = STATE["load"]._entry_functions(SPEC["entry"])
    _, batch = check_dataset(functions)
    model = build_model(functions)
    check_fsdp(model)
    check_train(functions, model, batch)


def _fallback_args(merge: Any) -> Any:
    """Without parsed arguments: the `--mm-*` files of the launch merged by MindSpeed-MM's `merge_mm_args` (and its
    --fsdp2-config-path), so the checks that need no more than that still judge the scaffold."""
    import argparse

    flags = {
        "--mm-model": "mm_model",
        "--mm-data": "mm_data",
        "--mm-tool": "mm_tool",
        "--fsdp2-config-path": "fsdp2_config_path",
    }
    args = argparse.Namespace(
        mm_model="",
        mm_data="",
        mm_tool="",
        fsdp2_config_path=None,
        micro_batch_size=1,
        num_workers=0,
        seed=1234,
    )
    argv = SPEC["argv"]
    for i, word in enumerate(argv[:-1]):
        if word in flags:
            setattr(args, flags[word], argv[i + 1])
    with contextlib.redirect_stdout(io.StringIO()):
        merge(args)
    return args


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        OUT["error"] = traceback.format_exc()[-4000:]
    finally:
        load = STATE.get("load")
        if load is not None:
            OUT["stubbed"] = sorted(set(load.STUBBED))
            OUT["skipped"] = list(load.OUT["skipped"])
        Path(SPEC["out"]).write_text(json.dumps(OUT, default=str), encoding="utf-8")
