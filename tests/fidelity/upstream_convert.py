"""Child process: run MindSpeed-MM's own converters (`checkpoint/` of MM trees) on a list of cases.

Usage: `python upstream_convert.py RUNS_JSON`, a list of {"root": MindSpeed-MM tree, "cases": [argv, ...]};
the trees run one after the other in this one process (`checkpoint` is re-imported from each). Each case
is the argv of mm-agent's plan (`ConvertPlan.mm_convert_argv`: `mm-convert <Class> <method> --cfg.a.b V`),
read the way MindSpeed-MM's jsonargparse CLI reads it: dotted `--cfg.*` keys into nested fields, list
values as JSON, a nested config none of whose fields is given built from its defaults. Every key is
checked against the converter's own pydantic config (an unknown key fails, as under jsonargparse) and the
converter's method runs on the config object. jsonargparse itself is not needed (nor installed): the CLI
does no more than build this object.

Method arguments outside `cfg` (`--lora_rank 16 --lora_alpha 16` of merge_lora_to_base) are passed to the
method as keyword arguments, and merge_lora_to_base runs with `use_npu=False` (its CPU path, the one
MindSpeed-MM offers for hosts without an NPU).

Nothing of the conversion is stubbed: the Wan and Qwen2.5-VL converters import with torch, safetensors,
transformers, tqdm, numpy and pydantic only, except that `checkpoint/common/merge_base_lora_weight.py`
(which merge_lora_to_base imports for `lora_merge_to_base`) imports `mindspeed.megatron_adaptor` and
`torch_npu` at its top for its own NPU script; that function uses neither, so both are given as empty
modules when absent. One shim: MindSpeed-MM pins transformers 4.57, where `Qwen2_5_VLConfig` also
carries the LLM fields (`hidden_size`, `num_key_value_heads`, ...) at the top level; transformers 5 keeps
them only in `text_config`. Under transformers >= 5 a missing attribute of that config class is read from
its `text_config` (the same numbers), so the converter reads its config as under its pinned version.

Prints one JSON line per case: {"root", "argv", "ok", "error" (traceback or null), "checkpoint" (the file
the `checkpoint` package was imported from, so the parent can tell which tree really ran)}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any


def _value(text: str) -> Any:
    if text[:1] in "[{" or text.lstrip("-").isdigit():
        return json.loads(text)
    return text


def _nested(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`--cfg.a.b V` pairs -> {"a": {"b": V}} (jsonargparse's dotted form); other `--name V` pairs -> the
    method's keyword arguments."""
    out: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    if len(argv) % 2:
        raise ValueError(f"flags and values do not pair up: {argv}")
    for flag, raw in zip(argv[::2], argv[1::2], strict=True):
        if not flag.startswith("--"):
            raise ValueError(f"unexpected argument {flag!r}")
        if not flag.startswith("--cfg."):
            kwargs[flag[2:]] = _value(raw)
            continue
        *parents, leaf = flag[len("--cfg.") :].split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _value(raw)
    return out, kwargs


def _npu_imports() -> None:
    """Empty `mindspeed.megatron_adaptor` and `torch_npu` modules where they are not installed (see above)."""
    import importlib.util
    import types

    for package, modules in (
        ("mindspeed", ("mindspeed", "mindspeed.megatron_adaptor")),
        ("torch_npu", ("torch_npu",)),
    ):
        if package not in sys.modules and importlib.util.find_spec(package) is None:
            sys.modules.update({name: types.ModuleType(name) for name in modules})


def _with_defaults(model: Any, data: dict[str, Any]) -> dict[str, Any]:
    """jsonargparse builds a nested pydantic config none of whose fields is given from its defaults."""
    for name, info in model.model_fields.items():
        nested = getattr(info.annotation, "model_fields", None)
        if (
            name not in data
            and info.is_required()
            and nested is not None
            and not any(f.is_required() for f in nested.values())
        ):
            data[name] = {}
    return data


def _transformers_4_config() -> None:
    """transformers >= 5: read Qwen2_5_VLConfig's LLM fields from text_config, as 4.57 exposes them."""
    import transformers
    from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig

    if int(transformers.__version__.split(".")[0]) < 5 or "__getattr__" in vars(Qwen2_5_VLConfig):
        return

    def text_field(self: Any, name: str) -> Any:
        text = self.__dict__.get("text_config")
        if name.startswith("_") or text is None:
            raise AttributeError(name)
        return getattr(text, name)

    Qwen2_5_VLConfig.__getattr__ = text_field


def _check_fields(model: Any, data: dict[str, Any], where: str = "cfg") -> None:
    """Every key names a field of the pydantic config (jsonargparse refuses unknown keys)."""
    fields = model.model_fields
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"--{where}.{key}: no such field in {model.__name__} (fields: {sorted(fields)})")
        annotation = fields[key].annotation
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")]
        if isinstance(value, dict) and inner:
            _check_fields(inner[0], value, f"{where}.{key}")


def _run(argv: list[str]) -> None:
    _, cls_name, method, *flags = argv
    cfg, kwargs = _nested(flags)
    if cls_name == "WanConverter":
        from checkpoint.sora_model.convert_utils.cfg import ConvertConfig
        from checkpoint.sora_model.wan_converter import WanConverter

        _check_fields(ConvertConfig, cfg)
        if method == "merge_lora_to_base":
            _npu_imports()
            kwargs["use_npu"] = False
        getattr(WanConverter(), method)(ConvertConfig(**_with_defaults(ConvertConfig, cfg)), **kwargs)
    elif cls_name == "Qwen2_5_VLConverter":
        from checkpoint.vlm_model.converters import qwen2_5vl

        _transformers_4_config()
        if kwargs:
            raise ValueError(f"unexpected method arguments {sorted(kwargs)}")
        config_cls = {"hf_to_mm": qwen2_5vl.ConvertVppMMConfigQwen2_5}[method]
        _check_fields(config_cls, cfg)
        getattr(qwen2_5vl.Qwen2_5_VLConverter, method)(config_cls(**_with_defaults(config_cls, cfg)))
    else:
        raise ValueError(f"no runner for {cls_name}")


def _use_tree(root: Path) -> None:
    """Import `checkpoint` from this MindSpeed-MM tree (each version in turn, in one process)."""
    for name in [m for m in sys.modules if m == "checkpoint" or m.startswith("checkpoint.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p not in _TREES]
    _TREES.append(str(root))
    sys.path.insert(0, str(root))


_TREES: list[str] = []


def main() -> int:
    runs = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    for run in runs:
        _use_tree(Path(run["root"]))
        for argv in run["cases"]:
            line: dict[str, Any] = {"root": run["root"], "argv": argv, "ok": True, "error": None}
            try:
                _run(argv)
            except Exception:  # reported per case; the parent fails that case with the traceback
                line.update(ok=False, error=traceback.format_exc())
            line["checkpoint"] = getattr(sys.modules.get("checkpoint"), "__file__", None)
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
