"""The user's own DiT (MindSpeed-MM's new-model flow), imported from its file and built from model.json.

MindSpeed-MM builds a predictor as `PredictModel` does (`mindspeed_mm/models/predictor/predict_model.py`):
`PREDICTOR_MODEL_MAPPINGS[config.model_id](**config.to_dict())`, every key of the `predictor` block,
`model_id` included, passed as a keyword. The bundled runtime does the same with the class named by
`--predictor-file PATH --predictor-class NAME`, so what trains here is the user's module itself, not a copy.

The guide's DiT file subclasses `mindspeed_mm.models.common.module.MultiModalModule`. The runtime rehearses the
user's code on a machine that may have no MindSpeed-MM checkout (a laptop, CI, the demo), so when `mindspeed_mm`
is not importable a small stand-in for exactly that one module is put in place before the file is imported
(`MultiModalModule`: `__init__(config)`, `input_tensor`, `set_input_tensor`, the interface the DiT uses). A real
`mindspeed_mm` is never shadowed: when one is importable the user's file imports it as it would in training.

Every problem a user can cause (no such file, an import error inside it, no such class, a model.json key the
class does not take, a checkpoint that does not fit) is a `RuntimeFailure` naming the file, field and fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runtime.checkpoint import state_mismatch
from runtime.errors import RuntimeFailure

STANDIN = "mindspeed_mm.models.common.module"
_PRIVATE_PREFIX = "_mm_agent_user_dit_"
# keys PredictModel / MindSpeed-MM's configs put in predictor blocks, whatever the class
MM_KEYS = frozenset({"model_id", "from_pretrained", "dtype", "pipeline_num_layers"})


class MultiModalModule(nn.Module):
    """Stand-in for MindSpeed-MM's `MultiModalModule` (a `MegatronModule` that keeps its config and the
    pipeline's input tensor), for rehearsing a user's DiT without MindSpeed-MM installed."""

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.config = config
        self.input_tensor: Any = None

    def set_input_tensor(self, input_tensor: Any) -> None:
        """Pipeline parallelism feeds the previous stage's output here; the bundled runtime never does."""
        self.input_tensor = input_tensor


def mindspeed_mm_installed() -> bool:
    """True when a real `mindspeed_mm` package can be imported (the stand-in does not count, and neither does a
    folder without `__init__.py`, such as a scaffold overlay's `mindspeed_mm/` in the current directory, which
    Python would take for a namespace package)."""
    existing = sys.modules.get("mindspeed_mm")
    if existing is not None:
        return (
            not getattr(existing, "__mm_agent_standin__", False)
            and getattr(existing, "__file__", None) is not None
        )
    spec = importlib.util.find_spec("mindspeed_mm")
    return spec is not None and spec.origin not in (None, "namespace")


def install_standin() -> bool:
    """Put the stand-in `mindspeed_mm.models.common.module` in `sys.modules` unless a real MindSpeed-MM is
    importable; returns whether the stand-in is in place. Only that dotted name and its parent packages are
    created; anything else under `mindspeed_mm` stays unimportable, so a file needing more says so."""
    if mindspeed_mm_installed():
        return False
    parts = STANDIN.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = sys.modules.get(name)
        if module is None:
            module = types.ModuleType(name, "mm-agent's stand-in (no MindSpeed-MM installed)")
            module.__mm_agent_standin__ = True  # type: ignore[attr-defined]
            if depth < len(parts):
                module.__path__ = []  # a package, so the next level can be imported from it
            sys.modules[name] = module
            if depth > 1:
                setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], module)
    sys.modules[STANDIN].MultiModalModule = MultiModalModule  # type: ignore[attr-defined]
    return True


def load_dit_class(path: str, class_name: str) -> type[nn.Module]:
    """Import the file at `path` under a private module name and return its class `class_name`."""
    file = Path(path)
    fix_file = "pass the DiT file the scaffold wrote (mindspeed_mm/models/predictor/dits/<name>_dit.py)"
    if not file.is_file() or file.suffix != ".py":
        raise RuntimeFailure(
            f"--predictor-file {file} is not a Python file",
            file=str(file),
            field="--predictor-file",
            fix=fix_file,
        )
    standin = install_standin()
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    name = f"{_PRIVATE_PREFIX}{digest}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise RuntimeFailure(f"cannot import {file}", file=str(file), field="--predictor-file", fix=fix_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        sys.modules.pop(name, None)
        missing = getattr(exc, "name", None) or ""
        only = (
            f"; without MindSpeed-MM installed the runtime provides only {STANDIN}.MultiModalModule"
            if standin and missing.startswith("mindspeed_mm")
            else ""
        )
        raise RuntimeFailure(
            f"importing {file} failed: {exc}{only}",
            file=str(file),
            field="--predictor-file",
            fix="install the package it needs, or build the DiT from torch/diffusers modules (as the "
            "guide's CustomDiT does) so it trains without a MindSpeed-MM checkout",
        ) from exc
    except Exception as exc:  # the user's module body: any error is theirs to fix, shown without a traceback
        sys.modules.pop(name, None)
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(file):
                where = f" (line {tb.tb_lineno})"
            tb = tb.tb_next
        if isinstance(exc, SyntaxError) and exc.lineno:
            where = f" (line {exc.lineno})"
        raise RuntimeFailure(
            f"importing {file} failed{where}: {type(exc).__name__}: {exc}",
            file=str(file),
            field="--predictor-file",
            fix="fix the error in the DiT file (python -c 'import ...' shows the same)",
        ) from exc
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        classes = sorted(
            n for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == name
        )  # fmt: skip
        what = "is not a torch.nn.Module class" if found is not None else "is not defined"
        raise RuntimeFailure(
            f"{class_name!r} {what} in {file}; its nn.Module classes: {', '.join(classes) or 'none'}",
            file=str(file),
            field="--predictor-class",
            fix=f"pass the DiT class name: one of {', '.join(classes)}" if classes else fix_file,
        )
    return found


def build_dit(cls: type[nn.Module], predictor: dict[str, Any], model_file: str) -> nn.Module:
    """`cls(**predictor)`, as MindSpeed-MM's PredictModel calls it; a key the class does not take (or a
    required one model.json lacks) is refused naming `predictor.<key>` before anything runs."""
    try:
        inspect.signature(cls).bind(**predictor)
    except TypeError as exc:
        key = _key_of(str(exc))
        raise RuntimeFailure(
            f"{cls.__name__}.__init__ does not accept model.json's predictor block: {exc} (MindSpeed-MM's "
            "PredictModel calls model_cls(**config.to_dict()) and raises the same TypeError)",
            file=model_file,
            field=f"predictor.{key}" if key else "predictor",
            fix=f"make the predictor keys match {cls.__name__}{_params(cls)} (add **kwargs to accept "
            "MindSpeed-MM's own keys such as model_id)",
        ) from exc
    try:
        return cls(**predictor)
    except RuntimeFailure:
        raise
    except Exception as exc:  # the user's __init__ with these values: theirs to fix
        raise RuntimeFailure(
            f"building {cls.__name__} from model.json's predictor block failed: {type(exc).__name__}: {exc}",
            file=model_file,
            field="predictor",
            fix=f"check the predictor values against what {cls.__name__}.__init__ needs (e.g. widths that "
            "divide by the head count)",
        ) from exc


def _params(cls: type) -> str:
    return str(inspect.signature(cls).replace(return_annotation=inspect.Signature.empty))


def loose_keys(cls: type, predictor: dict[str, Any]) -> list[str]:
    """predictor keys that reach the class only through its **kwargs (so a misspelt size is silently ignored,
    in MindSpeed-MM too), less the keys MindSpeed-MM puts in every predictor block."""
    params = inspect.signature(cls).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return sorted(set(predictor) - named - MM_KEYS)


def _key_of(message: str) -> str | None:
    """The keyword a binding TypeError names ("unexpected keyword argument 'x'", "missing ... argument: 'x'")."""
    if "'" not in message:
        return None
    return message.split("'")[-2]


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Strict load of a checkpoint into the user's DiT; missing, unexpected or wrongly shaped tensors are
    named (MindSpeed-MM's load_state_dict would raise them as one long RuntimeError)."""
    parts = state_mismatch(model.state_dict(), state)
    if parts:
        raise RuntimeFailure(
            f"checkpoint {source} does not fit {type(model).__name__}: {'; '.join(parts)}",
            file=source,
            field="--load",
            fix="load a checkpoint this DiT saved with the same predictor sizes in model.json, or train "
            "from random init (omit --load)",
        )
    model.load_state_dict(state, strict=True)
