"""Child process: what a rendered job's conversion writes and what its training model asks for, both by MindSpeed-MM.

Usage: `python upstream_load.py SPEC_JSON`; SPEC holds the trees (`mm`, `mindspeed`, `megatron`), `out` (the JSON
written at the end) and up to three phases, run in this order in this one process:

1. `make` (FSDP2-native models only): the tiny Hugging Face checkpoint, saved from MindSpeed-MM's own model class
   (`model_register.get(model_id)._from_config(config)`, real tensors; a tied head stored once) as
   `save_pretrained` writes it: the native
   classes are transformers' modeling files as MindSpeed-MM pins them (Qwen3-VL-MoE: 4.57, experts
   `[E, I, H]`), so their parameters are the released checkpoint's names and shapes; the transformers installed
   here (5.x) stores the MoE experts in another layout and cannot stand in.
2. `convert`: the rendered conversion command (`["mm-convert", ...]` or `["python", "-c", CODE, ...]`) run by
   MindSpeed-MM's own converter CLI, `checkpoint.convert_cli.main` of the tree (jsonargparse over
   `Commandable.subclasses`, the console script MindSpeed-MM installs), with `sys.argv` as the shell sets it.
   Then the tensors it wrote, read with torch: a Megatron rank file's `model` state dict (`layout: mm`, the
   single rank file of a TP=1 PP=1 conversion) or a DCP checkpoint's metadata (`layout: dcp`).
3. `model`: the training job's model on the meta device, built by MindSpeed-MM's own code from the rendered job:
   - `kind: megatron`: `mindspeed.megatron_adaptor` imported with the launch's argv (as the entry script does
     first), a one-process gloo group with Megatron's parallel state, the launch's argv parsed and validated by
     the checkout's parser (`mm_agent/validate/mmparser_child.py`: Megatron + MindSpeed + MindSpeed-MM, the
     `--mm-*` JSON configs merged into `args.mm`), then the entry script's own `model_provider` (its
     functions compiled from the script's source and run; its imports run one by one and the training
     machinery the model does not use may fail to import: listed in `skipped`), called under
     `torch.device("meta")`; its `state_dict()` (None entries, Megatron's `_extra_state`, dropped). A
     pretrain_transformers.py launch is its YAML, whose gpt_args MindSpeed-MM's read_yaml_config.py turns into
     the argv first; its torch_dcp load asks for the state dict under `model.` (spec `prefix`);
   - `kind: fsdp`: the rendered YAML read by the checkout's FSDP2 reader (`parse_args(Arguments)` at 26.0.0,
     `ConfigManager` at 26.1.0), its `training.plugin` packages imported (`import_plugin`), then
     `ModelHub.build(args.model, args.training)` as the trainer calls it (meta device with the stock
     `init_model_with_meta_device: true`); the names a DCP load asks for are `model.` + the model's state dict
     names (`{"model": ModelState(model)}`, dcp_checkpointer.py), after what the trainer does before it loads
     (a meta model allocated with `to_empty_if_needed`; 26.1.0's `retie_embeddings`).

Stand-ins, and why (the rest runs as written): `torch_npu`, `acl`, `tbe`, `mindspeed.op_builder`, `mindspeed.ops`
(NPU kernels), `mindspeed_mm.fsdp.ops` (NPU operator patches) and the Ascend triton kernels of a model
(`mindspeed_mm.*.triton`, Qwen3.5's gated delta rule); `megatron.training`'s package `__init__`
(the whole training stack; `get_args` answers this run's arguments); `mindspeed_mm.data`'s package `__init__`,
`mindspeed_mm.data.dataloader` and `mindspeed_mm.models.ae` (data loading and the VAE stack, which models
import for constants only); transformers' Qwen2-VL image processor (needs torchvision); any other third-party
module a MindSpeed-MM, MindSpeed or Megatron file imports that this environment lacks (`stubbed` in the output;
`beartype.typing` is `typing`). torch's `privateuse1` backend is named `npu` (as torch_npu names it: modules
default devices to `torch.device("npu")`), `Tensor.npu()` returns the tensor, and transformers 5 gets back the
`default` RoPE initialiser and two names it dropped (`OutputRecorder`, `check_model_inputs`, the latter in the
form that takes both decorator uses, as pretrain_transformers.py installs it) that the native Qwen3-VL file imports
at 26.x; Qwen2-VL's, Qwen2.5-VL's and GLM-4.1V's configs read their LLM fields as transformers 4.57 did
(`_transformers_4_configs`, as upstream_convert.py). Where MindSpeed-MM's model files were written for transformers
4.57 and run here under 5 (`_transformers_5`): Qwen2VLRotaryEmbedding gets `rope_parameters` / `rope_init_fn` from
4.57's fields (GLM-4.1V's LLM rotary embedding), 5's in-__init__ config validators skip a config not built yet,
4.57's `pad_token_id` & co. default to None, a plugin's own config class is registered over a transformers model
type of the same name (`_plugin_configs`: 4.57 has no Qwen3-ASR) and a 4.57-style class is tied as 4.57 ties it
(`_tie_as_4_57`). FSDP2 model files ask `is_npu_available()` for their parameter layout and are answered as on the
NPU the job runs on (`_on_npu`). Megatron's optional TE / Apex imports stay absent.

Writes {"made", "converted", "convert_error", "model", "model_error", "stubbed", "skipped", "shared"}: name -> shape
maps, and (FSDP2-native) the model's parameters that are another one's tensor at load time (name -> that name).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEC: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
MM, MS, MEG = (str(Path(SPEC[k]).resolve()) for k in ("mm", "mindspeed", "megatron"))
ROOTS = (MM, MS, MEG)
OPTIONAL = (
    "transformer_engine",
    "apex",
    "flash_attn",
    "triton",
    "nvidia_resiliency_ext",
    "modelopt",
    "tensorstore",
)
OFF_PATH = (
    "mindspeed.ops",
    "mindspeed_mm.fsdp.ops",
    "mindspeed_mm.data.dataloader",
    "mindspeed_mm.models.ae",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl",
)
STUBBED: list[str] = []
OUT: dict[str, Any] = {"made": None, "converted": None, "convert_error": None, "model": None,
                       "model_error": None, "stubbed": STUBBED, "skipped": [], "shared": {}}  # fmt: skip


def _shapes(state: Any, prefix: str = "") -> dict[str, list[int]]:
    import torch

    out: dict[str, list[int]] = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and not name.endswith("_extra_state"):
            out[prefix + name] = list(value.shape)
    return out


# ------------------------------------------------------------------------------------------------ stand-ins
def _child() -> Any:
    sys.path[:0] = [str(HERE.parents[1] / "mm_agent" / "validate")]
    import mmparser_child

    return mmparser_child


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "beartype.typing":
            import typing

            return typing
        module = _child()._StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Off(importlib.abc.MetaPathFinder):
    """First on the path: the NPU and data modules named in OFF_PATH."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        kernels = (
            name.startswith("mindspeed_mm.") and ".triton" in name
        )  # Ascend triton kernels (no parameters)
        if kernels or any(name == p or name.startswith(p + ".") for p in OFF_PATH):
            STUBBED.append(name)
            return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
        return None


class _Missing(importlib.abc.MetaPathFinder):
    """Last on the path: a third-party module the upstream trees import and this environment lacks."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in ("mindspeed_mm", "megatron", "mindspeed", "checkpoint", *OPTIONAL):
            return None
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back
        if frame is None or not frame.f_code.co_filename.startswith(ROOTS):
            return None
        STUBBED.append(name)
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)


ARGS: dict[str, Any] = {}


def _install() -> Any:
    """Everything the model phases need before the first upstream import (see the module docstring); once."""
    if "child" in ARGS:
        return ARGS["child"]
    import torch

    torch.utils.rename_privateuse1_backend("npu")
    # MindSpeed 26.1.0 imports two grad-scaler names from torch.cuda.amp, where torch 2.7 (its pin) re-exports
    # them and this torch does not: the same objects from torch.amp
    import torch.amp.grad_scaler as amp_scaler
    import torch.cuda.amp.grad_scaler as cuda_scaler

    for name in ("_MultiDeviceReplicator", "OptState"):
        if not hasattr(cuda_scaler, name) and hasattr(amp_scaler, name):
            setattr(cuda_scaler, name, getattr(amp_scaler, name))
    setattr(torch.Tensor, "npu", lambda self, *args, **kwargs: self)  # noqa: B010
    # transformers settles what it has (no torchvision here) before any stand-in exists
    import transformers  # noqa: F401
    from transformers import AutoProcessor, DataCollatorForLanguageModeling, WhisperProcessor  # noqa: F401
    from transformers.trainer_pt_utils import LabelSmoother  # noqa: F401

    child = _child()
    for root in reversed(ROOTS):
        if root not in sys.path:
            sys.path.insert(0, root)
    child._install_stubs(MEG, MM)
    training = sys.modules["megatron.training"]
    vars(training)["get_args"] = lambda: ARGS["args"]
    data = child._package("mindspeed_mm.data", os.path.join(MM, "mindspeed_mm", "data"))
    for name in (
        "megatron.training",
        "megatron.training.utils",
        "megatron.training.activations",
        data.__name__,
    ):
        module = sys.modules[name]
        module.__class__ = child._StubModule
        # MindSpeed 26.1.0 asks importlib.util.find_spec("megatron.training"), which needs a spec
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=hasattr(module, "__path__"))
    sys.meta_path.insert(0, _Off())
    sys.meta_path.append(_Missing())
    _transformers_5()
    ARGS["child"] = child
    return child


def _transformers_5() -> None:
    """Names the 26.x native model files import that transformers 5 dropped (see the module docstring)."""
    import torch
    import transformers.utils.generic as generic
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if not hasattr(generic, "OutputRecorder"):
        vars(generic)["OutputRecorder"] = lambda *args, **kwargs: None
    # 4.57's decorator is used bare and called (`@check_model_inputs()`, Qwen3-ASR at 26.1.0); 5's takes the
    # function only: one that takes both, as pretrain_transformers.py installs under transformers 5 (its :13-31)
    vars(generic)["check_model_inputs"] = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)

    def default_rope(config: Any, device: Any = None, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        params = getattr(config, "rope_parameters", None) or {}
        factor = getattr(config, "partial_rotary_factor", None) or params.get("partial_rotary_factor") or 1.0
        dim = int(head * factor)
        base = params.get("rope_theta") or getattr(config, "rope_theta", 10000.0)
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0

    ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)

    # transformers 5 validates a config inside PreTrainedConfig.__init__ (`@strict` class validators), which a
    # 4.57-style subclass calls before it sets its sub-configs (Qwen3-ASR's get_text_config reads thinker_config):
    # 4.57 validated nothing there, and these validators only check values (token ids in the vocabulary, head
    # sizes), so one that finds the config not built yet is skipped
    from transformers.configuration_utils import PreTrainedConfig

    validators = getattr(PreTrainedConfig, "__class_validators__", None)
    if validators and not getattr(PreTrainedConfig, "_mm_agent_tolerant", False):

        def tolerant(check: Any) -> Any:
            def run(self: Any) -> None:
                with contextlib.suppress(AttributeError):
                    check(self)

            run.__name__ = check.__name__
            return run

        PreTrainedConfig.__class_validators__ = [tolerant(v) for v in validators]  # type: ignore[attr-defined]
        PreTrainedConfig._mm_agent_tolerant = True  # type: ignore[attr-defined]
    # and 4.57's PretrainedConfig gave every config these token ids (None unless set), which 4.57-style model files
    # read (Qwen3-ASR's `config.pad_token_id`); 5 keeps them on the text configs that declare them
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id"):
        if not hasattr(PreTrainedConfig, name):
            setattr(PreTrainedConfig, name, None)

    # MindSpeed-MM's GLM-4.1V LLM rotary embedding subclasses transformers' Qwen2VLRotaryEmbedding, which reads
    # `rope_scaling` / `rope_theta` at 4.57 and `rope_parameters` at 5, and calls 4.57's `self.rope_init_fn`: a
    # config that has only the former gets the latter from them, and the instance its initialiser (buffers only,
    # no parameter)
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    rotary = modeling_qwen2_vl.Qwen2VLRotaryEmbedding
    if not getattr(rotary, "_mm_agent_rope_parameters", False):
        init = rotary.__init__

        def rotary_init(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(config, "rope_parameters", None) is None:
                scaling = dict(getattr(config, "rope_scaling", None) or {})
                kind = scaling.get("rope_type", scaling.get("type", "default"))
                config.rope_parameters = {
                    **scaling, "rope_type": "default" if kind == "mrope" else kind,
                    "rope_theta": getattr(config, "rope_theta", 10000.0),
                    "partial_rotary_factor": getattr(config, "partial_rotary_factor", 1.0),
                }  # fmt: skip
                if getattr(config, "mrope_section", None) is not None:
                    config.rope_parameters.setdefault("mrope_section", config.mrope_section)
            init(self, config, *args, **kwargs)
            if "rope_init_fn" not in vars(self):
                kind = config.rope_parameters["rope_type"]
                self.rope_init_fn = (
                    rotary.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
                )

        rotary.__init__ = rotary_init  # type: ignore[method-assign]
        rotary._mm_agent_rope_parameters = True  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ phases
def _on_npu() -> None:
    """The job runs on an NPU, and MindSpeed-MM's FSDP2 model files choose their parameter layout by asking
    `is_npu_available()` (Qwen3-Omni's grouped experts: `use_grouped_expert_matmul and is_npu_available()`,
    fsdp/models/qwen3omni/modeling_qwen3_omni_moe.py:1675 at 26.1.0): it answers as on the NPU, before any model
    file imports it. The NPU kernels themselves never run (the model is built on the meta device)."""
    import mindspeed_mm.fsdp.utils.utils as fsdp_utils

    vars(fsdp_utils)["is_npu_available"] = lambda: True


def _native_class(model_id: str, plugin: str) -> Any:
    from mindspeed_mm.fsdp.utils.register import import_plugin, model_register

    _on_npu()

    with contextlib.redirect_stdout(io.StringIO()):
        import_plugin([plugin])
    _plugin_configs([plugin])
    return model_register.get(model_id)


def _plugin_configs(plugins: list[str]) -> None:
    """A plugin registers its own config class for its model type (`AutoConfig.register`, qwen3_asr/__init__.py at
    26.1.0). MindSpeed-MM pins transformers 4.57.0 (pyproject.toml:23 at 26.1.0), which has no such model; a newer
    transformers that ships one under the same name refuses the registration (the plugin catches the ValueError) and
    would read the checkpoint's config.json into its own, differently laid out class. The plugin's class is
    registered over it, as it holds under the pinned version."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    roots = tuple(os.path.join(MM, p) for p in plugins)
    for name, module in list(sys.modules.items()):
        if not (getattr(module, "__file__", None) or "").startswith(roots):
            continue
        for value in list(vars(module).values()):
            if not (
                isinstance(value, type) and issubclass(value, PretrainedConfig) and value.__module__ == name
            ):
                continue
            model_type = getattr(value, "model_type", "")
            if model_type in CONFIG_MAPPING_NAMES:
                AutoConfig.register(model_type, value, exist_ok=True)


def _tie_as_4_57(model: Any) -> None:
    """transformers 4.57 ties a model's output head to its input embedding in post_init (`tie_weights`) when its text
    config says tie_word_embeddings, for every model part built with its own post_init; a 4.57-style class (its
    `_tied_weights_keys` a list, as in MindSpeed-MM's Qwen3-ASR at 26.1.0) is not tied by transformers 5, whose
    tying reads a mapping. Such parts are tied here as 4.57 ties them (same Parameter, as `_tie_or_clone_weights`)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if not isinstance(module, PreTrainedModel) or not isinstance(
            vars(type(module)).get("_tied_weights_keys"), list
        ):
            continue
        config = module.config
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        if not getattr(text, "tie_word_embeddings", True):
            continue
        try:
            out, inp = module.get_output_embeddings(), module.get_input_embeddings()
        except NotImplementedError:
            continue
        if out is not None and inp is not None:
            out.weight = inp.weight


def make(spec: dict[str, Any]) -> None:
    import torch
    from transformers import AutoConfig

    cls = _native_class(spec["model_id"], spec["plugin"])
    config = AutoConfig.for_model(spec["model_type"], **spec["config"])
    torch.manual_seed(0)
    model = cls._from_config(config)
    _tie_as_4_57(model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    # what save_pretrained writes (transformers 5's save_pretrained does not take 4.57's list of tied keys): a
    # parameter that is another one's tensor (a tied output head) is stored once, under the first name
    from safetensors.torch import save_file

    seen: set[int] = set()
    tied: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k not in tied}
    Path(spec["out"]).mkdir(parents=True, exist_ok=True)
    save_file(state, str(Path(spec["out"]) / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(spec["out"])
    OUT["made"] = _shapes(state)


def _transformers_4_configs() -> None:
    """transformers >= 5 keeps the Qwen2-VL / Qwen2.5-VL LLM fields (hidden_size, num_key_value_heads, ...) only in
    `text_config`; 4.57, which MindSpeed-MM pins, also has them on the config itself, where the converters read
    them. A missing attribute of those config classes is read from `text_config` (the same numbers), as in
    upstream_convert.py."""
    import transformers
    from transformers.models.glm4v import Glm4vConfig
    from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig
    from transformers.models.qwen2_vl import Qwen2VLConfig

    if int(transformers.__version__.split(".")[0]) < 5:
        return

    def text_field(self: Any, name: str) -> Any:
        text = self.__dict__.get("text_config")
        if name.startswith("_") or text is None:
            raise AttributeError(name)
        return getattr(text, name)

    for cls in (Qwen2VLConfig, Qwen2_5_VLConfig, Glm4vConfig):
        if "__getattr__" not in vars(cls):
            cls.__getattr__ = text_field  # type: ignore[attr-defined]


def convert(spec: dict[str, Any]) -> None:
    import torch

    argv = spec["argv"]
    if MM not in sys.path:
        sys.path.insert(0, MM)
    _transformers_4_configs()
    saved = sys.argv
    try:
        if argv[0] == "mm-convert":
            from checkpoint.convert_cli import main

            sys.argv = list(argv)
            main()
        elif argv[:2] in (["python", "-c"], ["python3", "-c"]):
            sys.argv = ["-c", *argv[3:]]
            exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"})
        else:
            raise ValueError(f"not a converter command: {argv[:3]}")
    finally:
        sys.argv = saved
    target = Path(spec["target"])
    iteration = (target / "latest_checkpointed_iteration.txt").read_text().strip()
    folder = target / ("release" if iteration == "release" else f"iter_{int(iteration):07d}")
    if spec["layout"] == "dcp":
        from torch.distributed.checkpoint import FileSystemReader

        meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
        OUT["converted"] = {k: list(v.size) for k, v in meta.items() if hasattr(v, "size")}
    else:
        state = torch.load(
            folder / "mp_rank_00" / "model_optim_rng.pt", map_location="cpu", weights_only=False
        )
        OUT["converted"] = _shapes(state["model"])


def _entry_functions(entry: str) -> dict[str, Any]:
    """The entry script's functions (model_provider and its helpers) compiled from its source; its imports run
    one by one, its module-level statements that start the MindSpeed adaptor or training do not."""
    path = os.path.join(MM, entry)
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    namespace: dict[str, Any] = {"__name__": Path(entry).stem, "__file__": path}
    for node in tree.body:
        code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(code, namespace)
            except Exception as exc:  # training machinery the model does not use; listed
                OUT["skipped"].append(f"{ast.unparse(node)}: {type(exc).__name__}: {exc}"[:300])
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            exec(code, namespace)
    return namespace


def model_megatron(spec: dict[str, Any]) -> None:
    import torch

    # Megatron allocates parameters on torch.cuda.current_device() (torch_npu answers it on an NPU) unless asked
    # to build them on the CPU, which under torch.device("meta") is the meta device; no name or shape changes
    argv = list(spec["argv"])
    if argv and argv[0].endswith(".yaml"):  # pretrain_transformers.py: its YAML's gpt_args are the flags
        sys.argv = [spec["entry"], *argv]
        argv = _install()._from_yaml(MM, spec["entry"], argv)
    argv = [*argv, "--use-cpu-initialization"]
    sys.argv = [spec["entry"], *argv]
    child = _install()
    with contextlib.redirect_stdout(io.StringIO()):
        import mindspeed.megatron_adaptor  # noqa: F401  (the entry script's first import)
    parser = child.build_parser()
    validate, _ = child._validator()
    with contextlib.redirect_stdout(io.StringIO()):
        args = parser.parse_args(argv)
        args.rank, args.world_size = 0, 1
        validate(args, {})
    ARGS["args"] = args
    import megatron.training.global_vars as global_vars

    global_vars._GLOBAL_ARGS = args  # MindSpeed's wrappers (26.1.0: initialize_model_parallel's) read it
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    new_group = dist.new_group

    def cpu_group(*args: Any, **kwargs: Any) -> Any:
        """hccl is the NPU's collective backend (MindSpeed's layerzero groups ask for it): gloo on one process."""
        if kwargs.get("backend") == "hccl":
            kwargs["backend"] = "gloo"
        return new_group(*args, **kwargs)

    dist.new_group = cpu_group
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    provider = _entry_functions(spec["entry"])["model_provider"]
    with torch.device("meta"), contextlib.redirect_stdout(io.StringIO()):
        model = provider()
    # a torch_dcp load asks for the model's state dict under "model" (Megatron checkpointing.py:1308-1311 at
    # core_r0.12.1: {"model": model[0].state_dict(), ...}), flattened by DCP to "model.<name>"
    OUT["model"] = _shapes(model.state_dict(), prefix=spec.get("prefix", ""))


def model_fsdp(spec: dict[str, Any]) -> None:
    os.environ["NON_MEGATRON"] = "true"
    child = _install()
    arguments, reader = child._fsdp_reader(spec["reader"])
    sys.argv = ["trainer.py", spec["config"]]
    with contextlib.redirect_stdout(io.StringIO()):
        args = reader(arguments)
    # the attention implementation creates no parameter; flash-attn's package is absent on a CPU machine and
    # transformers refuses to build a model that names it
    args.model.attn_implementation = "sdpa"
    from mindspeed_mm.fsdp.models.modelhub import ModelHub
    from mindspeed_mm.fsdp.utils.register import import_plugin

    _on_npu()
    with contextlib.redirect_stdout(io.StringIO()):
        import_plugin(getattr(args.training, "plugin", []))
        _plugin_configs(list(getattr(args.training, "plugin", [])))
        # 26.0.0: build(model, training); 26.1.0: build(model, features, training) (trainer.py calls it so)
        parts = (
            [args.model, args.training]
            if not hasattr(args, "features")
            else [args.model, args.features, args.training]
        )
        model = ModelHub.build(*parts)
        _tie_as_4_57(model)
        # then what the trainer does before loading (trainer.py get_foundation_model): a meta model is allocated
        # (to_empty, here on the CPU; FSDP sharding left out), and from 26.1.0 the output head is tied to the
        # embedding again (retie_embeddings): a tied name the checkpoint lacks is filled through its partner
        if args.training.init_model_with_meta_device:
            import mindspeed_mm.fsdp.utils.utils as fsdp_utils

            if hasattr(
                fsdp_utils, "get_device_type"
            ):  # buffers go to the accelerator: this machine has a CPU
                vars(fsdp_utils)["get_device_type"] = lambda: "cpu"
            fsdp_utils.to_empty_if_needed(model, device="cpu")
        try:
            from mindspeed_mm.fsdp.checkpoint.utils import retie_embeddings
        except ImportError:  # 26.0.0 has none
            pass
        else:
            retie_embeddings(model)
    OUT["model"] = _shapes(model.state_dict(), prefix="model.")
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            OUT["shared"]["model." + name] = "model." + first[id(param)]
        else:
            first[id(param)] = name


def main() -> int:
    os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})  # one process, as torchrun sets it
    cwd = SPEC.get("cwd")
    if cwd:
        os.chdir(cwd)
    try:
        if SPEC.get("make"):
            try:
                _install()
                make(SPEC["make"])
            except BaseException:
                OUT["model_error"] = "making the checkpoint: " + traceback.format_exc()[-4000:]
                return 0
        if SPEC.get("convert"):
            try:
                convert(SPEC["convert"])
            except BaseException:  # jsonargparse exits on a bad command: reported, the model is still built
                OUT["convert_error"] = traceback.format_exc()[-4000:]
        model = SPEC.get("model")
        if model:
            try:
                (model_megatron if model["kind"] == "megatron" else model_fsdp)(model)
            except BaseException:
                OUT["model_error"] = traceback.format_exc()[-4000:]
    finally:
        OUT["stubbed"] = sorted(set(STUBBED))
        Path(SPEC["out"]).write_text(json.dumps(OUT), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
