"""Child process: MindSpeed-MM's real argument parser and argument validation, on a CPU.

Run as `python mmparser_child.py REQUEST.json` (never imported by mm-agent itself: it imports torch, Megatron,
MindSpeed and MindSpeed-MM). Reads one JSON request from that file (or stdin):

    {"mm_root": DIR, "mindspeed": DIR|null, "megatron": DIR|null,
     "jobs": [{"id", "entry", "argv": [str, ...], "world_size": int, "cwd": DIR, "env": {...},
               "kind": "megatron"|"fsdp", "reader": "read_yaml_config"|"parse_args"|"config_manager"|null}]}

and writes one JSON object to stdout: {"parser_options", "validator", "error", "results": [{"id", "ok",
"stage", "error", "argv"}]}. The parser is built once; every argv is parsed by it, then judged as
initialize_megatron would: MindSpeed's feature pre-validation, MindSpeed-MM's `validate_args` (Megatron's,
patched by MindSpeed-MM: merges the --mm-* JSON configs, world size vs TP*PP*CP, micro batch size, ...),
MindSpeed's feature post-validation and validation, then Megatron's micro-batch calculator (global batch
divisible by micro batch x data parallel). FSDP2-native entries go through the checkout's own YAML reader.

Stand-ins, and why: `torch_npu`, `acl`, `tbe`, `mindspeed.op_builder` (and scipy/torchdata/peft when not
installed) by an import hook; `megatron.training`'s package `__init__` (pulls in the whole training stack),
`activations` and `utils` (`get_device_arch_version` answers 9); the `mindspeed_mm` and `mindspeed_mm.fsdp`
package `__init__`s (they apply runtime patches); `torch.cuda.get_device_capability` answers (9, 0) as
torch_npu's transfer_to_npu does on an NPU; `_print_args` prints nothing. Left out: MindSpeed's legacy
`mindspeed.arguments.validate_args_wrapper` (see `_validator`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import traceback
import types
from typing import Any

STUBBED: tuple[str, ...] = ("torch_npu", "acl", "tbe", "mindspeed.op_builder")


class _AnyMeta(type):
    """Lets the stand-in class itself be indexed, iterated and searched (`dtype in torch_npu.unsupported_dtype`)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything

    def __getitem__(cls, key: Any) -> Any:
        return _Anything

    def __iter__(cls) -> Any:
        return iter(())

    def __contains__(cls, item: Any) -> bool:
        return False

    def __len__(cls) -> int:
        return 0


class _Anything(metaclass=_AnyMeta):
    """Stands for any attribute of a stubbed module: callable, indexable, usable as a decorator or base."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __getitem__(self, key: Any) -> Any:
        return _Anything()

    def __iter__(self) -> Any:
        return iter(())

    def __contains__(self, item: Any) -> bool:
        return False

    def __bool__(self) -> bool:
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if any(fullname == s or fullname.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _package(name: str, directory: str, **attrs: Any) -> types.ModuleType:
    """A package whose `__init__` is not run, but whose submodules import from `directory`."""
    module = types.ModuleType(name)
    module.__path__ = [directory]
    module.__file__ = os.path.join(directory, "__init__.py")
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def _print_rank_0(message: Any) -> None:
    print(message, file=sys.stderr)


def _update_use_dist_ckpt(args: Any) -> None:
    args.use_dist_ckpt = args.ckpt_format != "torch"


def _install_stubs(megatron_dir: str, mm_dir: str) -> None:
    global STUBBED
    import importlib.util

    # MindSpeed imports scipy (context parallel scheduling), MindSpeed-MM torchdata and peft (FSDP2 data,
    # LoRA) at module level; stubbed only where the interpreter lacks them
    optional = ("scipy", "torchdata", "peft")
    STUBBED = STUBBED + tuple(name for name in optional if importlib.util.find_spec(name) is None)
    sys.meta_path.insert(0, _StubFinder())
    import megatron  # the upstream tree: first on sys.path
    import torch  # real torch, CPU

    training = _package(
        "megatron.training",
        os.path.join(megatron_dir, "megatron", "training"),
        print_rank_0=_print_rank_0,
        print_rank_last=_print_rank_0,
        is_last_rank=lambda: True,
        get_args=lambda: None,
    )
    vars(megatron)["training"] = training
    activations = types.ModuleType("megatron.training.activations")
    vars(activations)["squared_relu"] = lambda x: x
    sys.modules["megatron.training.activations"] = activations
    utils = types.ModuleType("megatron.training.utils")
    vars(utils).update(
        get_device_arch_version=lambda: 9,
        update_use_dist_ckpt=_update_use_dist_ckpt,
        print_rank_0=_print_rank_0,
    )
    sys.modules["megatron.training.utils"] = utils
    package = _package("mindspeed_mm", os.path.join(mm_dir, "mindspeed_mm"))
    # the FSDP2 package's __init__ patches attention ops at import; its argument dataclasses need none of it
    vars(package)["fsdp"] = _package("mindspeed_mm.fsdp", os.path.join(mm_dir, "mindspeed_mm", "fsdp"))
    # torch_npu's transfer_to_npu answers torch.cuda queries on an NPU (GroupedGEMM asks the capability)
    vars(torch.cuda)["get_device_capability"] = lambda *args, **kwargs: (9, 0)
    if not hasattr(torch, "npu"):
        vars(torch)["npu"] = _StubModule("torch.npu")  # torch_npu adds it


def _mm_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`mindspeed_mm/configs/config.py` `_add_mm_args` (its module imports the MM runtime)."""
    group = parser.add_argument_group(title="multimodel")
    group.add_argument("--mm-data", type=str, default="")
    group.add_argument("--mm-model", type=str, default="")
    group.add_argument("--mm-tool", type=str, default="")
    return parser


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit 2
        raise _ParseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise _ParseError(message or f"exit {status}")


def build_parser() -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments
    from mindspeed.arguments import process_args as mindspeed_process_args
    from mindspeed_mm.arguments import process_args as mm_process_args

    parser: argparse.ArgumentParser = _Parser(description="Megatron-LM Arguments", allow_abbrev=False)
    parser = add_megatron_arguments(parser)
    # the order of MindSpeed-MM's training.py: extra provider (mm args), MM process_args, MindSpeed's
    parser = _mm_args(parser)
    parser = mm_process_args(parser)
    parser = mindspeed_process_args(parser)
    # MindSpeed's megatron_basic feature wraps Megatron's parse_args: every feature registers its args
    from mindspeed.features_manager import MindSpeedFeaturesManager

    MindSpeedFeaturesManager.register_features_args(parser)
    return parser


def _validator() -> tuple[Any, str]:
    """MindSpeed-MM's validate_args (Megatron's, patched by MindSpeed-MM), else Megatron's own."""
    try:
        import megatron.training.arguments as megatron_arguments
        from mindspeed_mm.patchs import validate_args_patch

        # MindSpeed's patched _print_args takes a third argument; printing is not judged here
        megatron_arguments._print_args = lambda *args, **kwargs: None
        validate_args_patch._print_args = megatron_arguments._print_args
        # MindSpeed-MM's validate_args itself. Importing the module also wraps it in MindSpeed's legacy
        # `mindspeed.arguments.validate_args_wrapper`, which rejects any --ckpt-format but torch with
        # --load/--save and so every stock FSDP2 example (torch_dcp): that wrapper is left out.
        raw = getattr(validate_args_patch.validate_args, "__wrapped__", validate_args_patch.validate_args)
        from mindspeed.features_manager import MindSpeedFeaturesManager as features

        def validate(args: Any, defaults: dict[str, Any]) -> Any:
            """MindSpeed's megatron_basic wrapper: every feature's pre-, post- and own validation around it."""
            features.pre_validate_features_args(args)
            args = raw(args, defaults)
            features.post_validate_features_args(args=args)
            features.validate_features_args(args=args)
            return args

        return (
            validate,
            "mindspeed_mm.patchs.validate_args_patch.validate_args + MindSpeed features' validate_args",
        )
    except Exception as exc:  # the MM module needs pieces of the runtime; fall back to Megatron's
        from megatron.training.arguments import validate_args

        return validate_args, f"megatron.training.arguments.validate_args ({type(exc).__name__}: {exc})"


def _from_yaml(mm_root: str, entry: str, argv: list[str]) -> list[str]:
    """MindSpeed-MM's own YAML reader (`mindspeed_mm/configs/read_yaml_config.py`, run by
    pretrain_transformers.py before anything else): it turns `gpt_args` of the YAML into sys.argv."""
    import runpy

    saved = sys.argv
    sys.argv = [entry, *argv]
    try:
        runpy.run_path(os.path.join(mm_root, "mindspeed_mm", "configs", "read_yaml_config.py"))
        return list(sys.argv[1:])
    finally:
        sys.argv = saved


def _microbatches(args: Any) -> None:
    """What initialize_megatron does next (global_vars.set_global_variables): Megatron's micro-batch
    calculator, which asserts the global batch is divisible by micro batch size x data-parallel size."""
    from megatron.core.num_microbatches_calculator import _build_num_microbatches_calculator

    _build_num_microbatches_calculator(
        args.rank,
        args.rampup_batch_size,
        args.global_batch_size,
        args.micro_batch_size,
        args.data_parallel_size,
        args.decrease_batch_size_if_needed,
    )


def _printed(buffer: io.StringIO) -> str:
    """What MindSpeed-MM printed about the failure ("Warning: Config file not found: ..."), last lines."""
    lines = [line for line in buffer.getvalue().splitlines() if line.strip()]
    wanted = [line for line in lines if any(w in line for w in ("Warning", "Error", "error", "not found"))]
    return ("; printed: " + " | ".join(wanted[-3:])[-600:]) if wanted else ""


def _where(exc: BaseException) -> str:
    """The innermost frame that reads `args` (an `ensure_valid(...)` helper raises one frame deeper)."""
    frames = traceback.extract_tb(exc.__traceback__)
    reading = [f for f in frames if "args" in (f.line or "")]
    last = reading[-1] if reading else (frames[-1] if frames else None)
    if last is None:
        return ""
    cause = exc.__cause__ or exc.__context__
    why = f"; caused by {type(cause).__name__}: {str(cause)[:300]}" if cause is not None else ""
    return f" (at {os.path.basename(last.filename)}:{last.lineno} `{(last.line or '').strip()}`){why}"


_READERS: dict[str, Any] = {}  # reader kind -> (Arguments, reader), or the exception importing it raised


def _fsdp_reader(kind: str) -> tuple[Any, Any]:
    if kind not in _READERS:
        try:
            _READERS[kind] = _load_fsdp_reader(kind)
        except Exception as exc:
            _READERS[kind] = exc
    found = _READERS[kind]
    if isinstance(found, Exception):
        raise found
    return found


def _load_fsdp_reader(kind: str) -> tuple[Any, Any]:
    """(Arguments, reader) of the checkout: 26.0.0's `parse_args(Arguments)`, 26.1.0's
    `ConfigManager(config_class=Arguments).load_and_parse()`."""
    from mindspeed_mm.fsdp.params.argument import Arguments

    if kind == "config_manager":
        from mindspeed_mm.config.config_manager import ConfigManager

        return Arguments, lambda cls: ConfigManager(config_class=cls).load_and_parse()
    from mindspeed_mm.fsdp.params.argument import parse_args

    return Arguments, parse_args


def _judge_fsdp(job: dict[str, Any]) -> dict[str, Any]:
    """FSDP2-native entries (mindspeed_mm/fsdp): the checkout's reader of the YAML named first."""
    result: dict[str, Any] = {"id": job["id"], "ok": False, "stage": "import", "error": None}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            arguments, reader = _fsdp_reader(str(job.get("reader")))
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}{_where(exc)}"
        return result
    result["stage"] = "parse"
    saved = sys.argv
    sys.argv = [job.get("entry") or "trainer.py", *job["argv"]]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            reader(arguments)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}{_where(exc)}"
        return result
    finally:
        sys.argv = saved
    result.update(ok=True, stage="done")
    return result


def judge(
    parser: argparse.ArgumentParser, validate: Any, job: dict[str, Any], mm_root: str
) -> dict[str, Any]:
    result: dict[str, Any] = {"id": job["id"], "ok": False, "stage": "parse", "error": None}
    argv = list(job["argv"])
    cwd = job.get("cwd") or os.getcwd()
    here = os.getcwd()
    os.environ["WORLD_SIZE"] = str(int(job.get("world_size") or 1))
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = "0"
    saved_env = {key: os.environ.get(key) for key in job.get("env") or {}}
    os.environ.update(job.get("env") or {})
    try:
        os.chdir(cwd)
        if job.get("kind") == "fsdp":
            return _judge_fsdp(job)
        if job.get("yaml_reader") and argv and argv[0].endswith(".yaml"):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    argv = _from_yaml(mm_root, job.get("entry") or "pretrain_transformers.py", argv)
            except Exception as exc:
                result["stage"] = "yaml"
                result["error"] = f"{type(exc).__name__}: {exc}{_where(exc)}"
                return result
        result["argv"] = argv
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                args = parser.parse_args(argv)
        except _ParseError as exc:
            result["error"] = str(exc)
            return result
        args.rank = 0
        args.world_size = int(job.get("world_size") or 1)
        result["stage"] = "validate"
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                validate(args, {})
                result["stage"] = "microbatches"
                _microbatches(args)
        except SystemExit as exc:
            result["error"] = f"validate_args exited ({exc.code}){_printed(printed)}"
            return result
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}{_where(exc)}{_printed(printed)}"
            return result
    finally:
        os.chdir(here)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result.update(ok=True, stage="done")
    return result


def main() -> int:
    if len(sys.argv) > 1:
        with open(sys.argv[1], encoding="utf-8") as handle:
            request = json.load(handle)
    else:
        request = json.load(sys.stdin)
    mm_root = os.path.abspath(request["mm_root"])
    roots = [mm_root]
    for key in ("mindspeed", "megatron"):
        if request.get(key):
            roots.append(os.path.abspath(request[key]))
    for root in reversed(roots):
        sys.path.insert(0, root)
    megatron_dir = request.get("megatron") or mm_root
    out: dict[str, Any] = {"parser_options": 0, "results": [], "validator": None, "error": None}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            _install_stubs(megatron_dir, mm_root)
            parser = build_parser()
            validate, name = _validator()
    except Exception as exc:
        out["error"] = f"could not build MindSpeed-MM's parser: {type(exc).__name__}: {exc}\n" + "".join(
            traceback.format_exc(limit=-6)
        )
        json.dump(out, sys.stdout)
        return 0
    out["validator"] = name
    out["parser_options"] = len(parser._option_string_actions)
    for job in request["jobs"]:
        out["results"].append(judge(parser, validate, job, mm_root))
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
