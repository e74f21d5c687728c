"""Child process: MindSpeed-MM's own code builds and shards a new DiT the way a training run does, on CPU.

Usage: `python newmodel_child.py CHECKOUT MODEL_JSON MODE [ARG]`, MODE one of
- `build`: `PredictModel(ConfigReader(model.json).predictor)` (mindspeed_mm/models/predictor/predict_model.py:
  PREDICTOR_MODEL_MAPPINGS lookup, `model_cls(**config.to_dict())`, and with `from_pretrained` the checkpoint
  loaded by mindspeed_mm/models/common/checkpoint.py `load_checkpoint`); prints `built <class> <blocks>`;
- `save PATH`: the same, then the predictor's state dict saved to PATH (a checkpoint for another `build`);
- `paths FSDP2_YAML`: the model.json's predictor inside a model with the SoRA-style blocks, and each path list
  of the FSDP2 config resolved by mindspeed_mm/models/transformers/base_model.py `get_submodules_by_path`.

A failure is left to raise: the interpreter prints the traceback a run prints, which the test diagnoses.

Stand-ins, and why (the rest is the checkout's code, run as written): Megatron (`megatron.core.mpu`: one pipeline
stage; `megatron.training`: `print_rank_0`, `get_args`, `unwrap_model`; `MegatronModule`: an nn.Module keeping
its config; `TransformerConfig`) and `mindspeed.utils` are the training stack this process does not start;
`mindspeed_mm.utils.utils` (imports the NPU stack) gives ConfigReader its `get_dtype`; the stock DiTs that
`dits/__init__.py` re-exports import NPU kernels, so the `dits` package is entered without running its
`__init__` (its modules load from its folder as usual) and the stock names predict_model.py imports from it
stand for classes this process never builds. The packages above are entered without their `__init__` too.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _package(name: str, folder: Path) -> types.ModuleType:
    """A package of the checkout entered without its __init__: its submodules load from `folder`."""
    return _module(name, __path__=[str(folder)])


class _Stock:
    """A stock DiT re-exported by dits/__init__.py (never built here)."""


class _Dits(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stock


class _MegatronModule(nn.Module):
    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.config = config


def _stand_ins(root: Path) -> None:
    mpu = types.SimpleNamespace(
        get_pipeline_model_parallel_world_size=lambda: 1,
        get_virtual_pipeline_model_parallel_world_size=lambda: None,
    )
    _module("megatron", __path__=[])
    _module("megatron.core", __path__=[], mpu=mpu)
    _module("megatron.core.mpu", **vars(mpu))
    _module("megatron.core.transformer", __path__=[])
    _module("megatron.core.transformer.module", MegatronModule=_MegatronModule)
    _module("megatron.core.transformer.transformer_config", TransformerConfig=object)
    _module("megatron.training", __path__=[], get_args=lambda: types.SimpleNamespace())
    _module("megatron.training.utils", print_rank_0=print, unwrap_model=lambda model: model)
    _module("mindspeed", __path__=[])
    _module("mindspeed.utils", _get_dtype=lambda name: getattr(torch, str(name), torch.float32))
    pkg = root / "mindspeed_mm"
    for name, folder in (
        ("mindspeed_mm", pkg),
        ("mindspeed_mm.utils", pkg / "utils"),
        ("mindspeed_mm.configs", pkg / "configs"),
        ("mindspeed_mm.models", pkg / "models"),
        ("mindspeed_mm.models.common", pkg / "models/common"),
        ("mindspeed_mm.models.predictor", pkg / "models/predictor"),
        ("mindspeed_mm.models.transformers", pkg / "models/transformers"),
    ):
        _package(name, folder)
    _module("mindspeed_mm.utils.utils", get_dtype=lambda value: value)
    dits = _Dits("mindspeed_mm.models.predictor.dits")
    dits.__path__ = [str(pkg / "models/predictor/dits")]
    sys.modules[dits.__name__] = dits


class _SoraStyle(nn.Module):
    """The blocks a SoRA-style model (SoRAModel, the guide's CustomModel) holds: the predictor is the DiT."""

    def __init__(self, predictor: nn.Module) -> None:
        super().__init__()
        self.predictor = predictor
        self.ae = nn.Identity()
        self.text_encoder = nn.Identity()


def main(argv: list[str]) -> None:
    root, model_json, mode = Path(argv[0]), Path(argv[1]), argv[2]
    sys.path.insert(0, str(root))
    _stand_ins(root)
    from mindspeed_mm.configs.config import ConfigReader
    from mindspeed_mm.models.predictor.predict_model import PredictModel

    config = ConfigReader(json.loads(model_json.read_text(encoding="utf-8")))
    torch.manual_seed(0)
    dit = PredictModel(config.predictor).get_model()
    blocks = getattr(dit, "blocks", [])
    print(f"built {type(dit).__name__} {len(blocks)}", flush=True)
    if mode == "save":
        torch.save(dit.state_dict(), argv[3])
    elif mode == "paths":
        from mindspeed_mm.models.transformers.base_model import get_submodules_by_path

        fsdp2 = yaml.safe_load(Path(argv[3]).read_text(encoding="utf-8"))
        model = _SoraStyle(dit)
        for key in ("sub_modules_to_wrap", "recompute_modules", "ignored_modules"):
            found = get_submodules_by_path(model, fsdp2.get(key))
            print(f"{key}: {len(found or [])} modules", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
