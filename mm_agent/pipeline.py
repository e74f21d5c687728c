"""The eight concrete pipeline stages for one (model, task, size, MindSpeed-MM version).

Everything here is derived from registry data (`ModelEntry`, `VersionTable`); there is no per-model branch,
so a new model file gets a correct pipeline without code changes. The only fixed tables are per *family* or
*template* (what raw data looks like), because that is a property of the training code, not of a model.
Commands are shell lines run from the MindSpeed-MM root after `env_setup` (which `cd`s there); for the
bundled runtime (`runtime="bundled"`) they are mm-agent commands run from the folder that holds the job.
"""

from __future__ import annotations

import functools
import posixpath
import re
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.errors import MMAgentError
from mm_agent.install.plan import host_arch
from mm_agent.install.schema import Arch
from mm_agent.install.steps import Layout, PlanStep, build_steps, plan_context
from mm_agent.jobspec import Runtime, bundled_refusal, is_bundled_vlm
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ConverterSpec, ModelEntry, SizeSpec, Stage, TaskSpec, VersionInfo

Direction = Literal["to_training", "to_hf"]


class PipelineStage(BaseModel):
    """One step of the job; `applies=False` stages are kept so every pipeline has the same eight rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: Stage
    applies: bool
    summary: str
    commands: list[str] = Field(
        default_factory=list, description="shell lines, run from the MindSpeed-MM root"
    )
    scripts: list[str] = Field(
        default_factory=list, description="MindSpeed-MM files this stage runs or edits"
    )
    notes: list[str] = Field(default_factory=list)
    sources: list[str] = Field(
        default_factory=list,
        description="where upstream says these steps: README § heading (registry/data/steps/<model>.yaml)",
    )


_ENV_VAR = re.compile(r"^\$[A-Z_][A-Z0-9_]*$")


def _sh(argv: list[str]) -> str:
    """`shlex.join`, except bare `$VAR` tokens stay unquoted so the shell still expands them."""
    return " ".join(a if _ENV_VAR.match(a) else shlex.quote(a) for a in argv)


def _list_arg(values: list[int], nested: bool) -> str:
    inner = "[" + ",".join(str(v) for v in values) + "]"
    return f"[{inner}]" if nested else inner


def is_vlm_converter(entry: ModelEntry) -> bool:
    """VLM converters (checkpoint/vlm_model) take `--cfg.mm_dir/hf_config/parallel_config`, sora ones not."""
    assert entry.converter is not None
    name = entry.converter.class_name
    return "VL" in name or "Omni" in name or entry.family == "vlm"


def hf_dir_for(entry: ModelEntry, size: SizeSpec) -> str:
    """Where `weights` downloads the HF checkpoint (MindSpeed-MM examples use `ckpt/hf_path/<repo>`)."""
    base = size.hf_ids[0].split("/")[-1] if size.hf_ids else f"{entry.id}-{size.id}"
    return f"ckpt/hf_path/{base}"


# Flat (jsonargparse) converters spell their arguments per class: (source, target, original-HF-dir) flags.
# The default is the DcpConverter base signature hf_to_dcp(hf_dir, save_dir) / dcp_to_hf(hf_dir, dcp_dir,
# save_dir); the overrides are the spellings the MindSpeed-MM READMEs use (reference §1.5, §2.1).
_FLAT_FLAGS: dict[str, dict[str, tuple[str, str, str | None]]] = {
    "DcpConverter": {
        "to_training": ("--hf_dir", "--save_dir", None),
        "to_hf": ("--dcp_dir", "--save_dir", "--hf_dir"),
    },
    "Qwen3VLConverter": {
        "to_training": ("--hf_dir", "--dcp_dir", None),
        "to_hf": ("--load_dir", "--save_dir", "--model_assets_dir"),
    },
    "GenericDCPConverter": {  # checkpoint/fsdp/generic_dcp_converter.py:19-27, 74-83 (26.0.0, 26.1.0)
        "to_training": ("--hf_dir", "--dcp_dir", None),
        "to_hf": ("--load_dir", "--save_dir", "--model_assets_dir"),
    },
    "Qwen3TTSConverter": {"to_hf": ("--load_dir", "--save_dir", "--model_assets_dir")},
    "MOSSTTSConverter": {"to_hf": ("--load_dir", "--save_dir", "--model_assets_dir")},
    "Qwen35Converter": {  # hf_to_dcp: checkpoint/vlm_model/converters/qwen3_5.py:27-35 (26.0.0)
        "to_training": ("--hf_dir", "--dcp_dir", None),
        "to_hf": ("--dcp_dir", "--save_hf_dir", "--origin_hf_dir"),
    },
    "Mistral3Converter": {  # checkpoint/vlm_model/converters/mistral3.py:54-58, 104-108 (26.0.0, 26.1.0)
        "to_training": ("--hf_dir", "--dcp_dir", None),
        "to_hf": ("--load_dir", "--save_dir", "--model_assets_dir"),
    },
}


def convert_dirs(entry: ModelEntry, size: SizeSpec) -> tuple[str, str]:
    """(source, target) of the to-training conversion; the target is the training LOAD_PATH.

    Sora converters glob `**/*.safetensors`, so for a diffusers pipeline repo they must see only the DiT
    folder `transformer/`; the MindSpeed-MM READMEs convert that folder in place (release/ next to the
    safetensors). Other converters write a separate `ckpt/mm_path/...` or `ckpt/dcp_path/...`.
    """
    hf_dir = hf_dir_for(entry, size)
    conv = entry.converter
    diffusers_repo = "diffusers" in hf_dir.lower()
    if conv is not None and conv.arg_style == "cfg" and not is_vlm_converter(entry) and diffusers_repo:
        return f"{hf_dir}/transformer", f"{hf_dir}/transformer"
    fmt = conv.target_format if conv else "mm"
    return hf_dir, f"ckpt/{fmt}_path/{hf_dir.rsplit('/', 1)[-1]}"


Layers = list[int] | list[list[int]]
ConvertRole = Literal["to_mm", "to_hf", "resplit", "flat_to_training", "flat_to_hf", "paths"]
_CFG_METHODS = ("hf_to_mm", "source_to_mm", "mm_to_hf", "resplit")


def convert_role(conv: ConverterSpec, method: str) -> ConvertRole:
    """Which argument shape `method` takes (reference §2.1); MMAgentError for methods with other shapes.

    Flat (DCP) converters spell their to-training/to-HF methods with flat flags; every other method this
    builder knows takes a pydantic `cfg`: the to-training method (hf_to_mm, source_to_mm), the export
    (mm_to_hf) and resplit. LoRA merges, layerzero and the like take extra arguments: they are run by hand.
    """
    if method not in conv.methods:
        raise MMAgentError(
            f"{conv.class_name} has no method {method!r}",
            field="method",
            fix=f"use one of: {', '.join(conv.methods)}",
        )
    if method in conv.path_methods:
        return "paths"
    if conv.arg_style == "flat" and method == conv.to_training:
        return "flat_to_training"
    if conv.arg_style == "flat" and method == conv.to_hf:
        return "flat_to_hf"
    if method in (conv.to_training, "hf_to_mm", "source_to_mm"):
        return "to_mm"
    if method in (conv.to_hf, "mm_to_hf"):
        return "to_hf"
    if method == "resplit":
        return "resplit"
    raise MMAgentError(
        f"mm-agent builds mm-convert commands for {conv.class_name}'s conversion methods "
        f"({', '.join(m for m in conv.methods if m in (conv.to_training, conv.to_hf, *_CFG_METHODS))}), "
        f"not for {method!r}, which takes method-specific arguments",
        field="method",
        fix=f"run it by hand in the MindSpeed-MM root: `mm-convert {conv.class_name} {method} --help`",
    )


def vpp_chunks(values: Layers) -> list[list[int]] | None:
    """The VPP chunks of a nested list, None for a flat (per-stage) list."""
    if values and all(isinstance(v, list) for v in values):
        return [list(v) for v in values if isinstance(v, list)]
    return None


def _flat_layers(values: Layers, name: str) -> list[int]:
    """mm_to_hf/resplit of VLM converters take flat lists: a single VPP chunk is unwrapped, more refused."""
    chunks = vpp_chunks(values)
    if chunks is None:
        return [v for v in values if isinstance(v, int)]
    if len(chunks) != 1:
        raise MMAgentError(
            f"{name} {values} is a VPP split; this method takes one list per pipeline stage",
            field=name,
            fix="pass the flat per-stage list, e.g. [12,16]",
        )
    return chunks[0]


def _layers_arg(values: Layers, nested: bool) -> str:
    chunks = vpp_chunks(values)
    if chunks is not None:
        return "[" + ",".join(_list_arg(c, nested=False) for c in chunks) + "]"
    return _list_arg([v for v in values if isinstance(v, int)], nested)


def mm_convert_argv(
    conv: ConverterSpec,
    method: str,
    *,
    vlm: bool,
    source: str,
    target: str,
    hf_dir: str | None = None,
    tp: int = 1,
    pp_layers: Layers | None = None,
    vit_pp_layers: Layers | None = None,
    source_tp: int | None = None,
    source_pp_layers: Layers | None = None,
    source_vit_pp_layers: Layers | None = None,
    init_args: dict[str, str] | None = None,
    audio_pp_layers: Layers | None = None,
) -> list[str]:
    """argv of `mm-convert <Class> [--init args] <method> ...` in the converter's own argument shape.

    Three CLI shapes exist (reference §2.1): sora `--cfg.source_path/target_path` with a flat PP list (a
    nested list means VPP); VLM `--cfg.mm_dir/hf_config.hf_dir/parallel_config.*` with *nested* lists for
    hf_to_mm and flat ones for mm_to_hf and resplit; DCP converters with flat flags. For VLM mm_to_hf the
    lists describe the source checkpoint; for resplit `source_*` do. Lists that are None are left out.
    `audio_pp_layers` (omni models) goes with hf_to_mm/mm_to_hf like the ViT list. The program is
    `converter_program(conv)`: `mm-convert`, or MindSpeed-MM's CLI after importing a module it misses.
    """
    role = convert_role(conv, method)
    argv = [*converter_program(conv), conv.class_name]
    for key, value in (conv.init_args if init_args is None else init_args).items():
        argv += [f"--{key}", value]
    argv.append(method)
    if role == "paths":
        return [*argv, "--cfg.source_path", source, "--cfg.target_path", target]

    if role in ("flat_to_training", "flat_to_hf"):
        direction = "to_training" if role == "flat_to_training" else "to_hf"
        src, dst, hf = {**_FLAT_FLAGS["DcpConverter"], **_FLAT_FLAGS.get(conv.class_name, {})}[direction]
        return [*argv, src, source, dst, target, *([hf, hf_dir or source] if hf else [])]

    if vlm:
        if role == "to_mm":
            argv += ["--cfg.mm_dir", target, "--cfg.hf_config.hf_dir", source]
            return argv + _vlm_parallel(
                "parallel_config", tp, pp_layers, vit_pp_layers, nested=True, audio=audio_pp_layers
            )
        if role == "to_hf":
            argv += [
                "--cfg.save_hf_dir",
                target,
                "--cfg.mm_dir",
                source,
                "--cfg.hf_config.hf_dir",
                hf_dir or source,
            ]
            return argv + _vlm_parallel(
                "parallel_config", tp, pp_layers, vit_pp_layers, nested=False, audio=audio_pp_layers
            )
        argv += ["--cfg.source_dir", source, "--cfg.target_dir", target]
        argv += _vlm_parallel(
            "source_parallel_config",
            source_tp or 1,
            source_pp_layers,
            source_vit_pp_layers,
            nested=False,
        )
        return argv + _vlm_parallel("target_parallel_config", tp, pp_layers, vit_pp_layers, nested=False)

    argv += ["--cfg.source_path", source, "--cfg.target_path", target]
    if role == "to_hf":
        return [*argv, "--cfg.hf_dir", hf_dir or source]
    if pp_layers and (vpp_chunks(pp_layers) is not None or len(pp_layers) > 1):
        argv += ["--cfg.target_parallel_config.pp_layers", _layers_arg(pp_layers, nested=False)]
    if tp > 1:
        argv += ["--cfg.target_parallel_config.tp_size", str(tp)]
    return argv


def converter_program(conv: ConverterSpec) -> list[str]:
    """The program that runs MindSpeed-MM's converter CLI for `conv`.

    `mm-convert` (MindSpeed-MM's console script, `checkpoint.convert_cli:main`) offers the converter classes
    whose modules `checkpoint/__init__.py` imports. For any other class (`cli_registered: false`, e.g.
    OpenSoraConverter and StepVideoConverter at 26.0.0) `mm-convert <class>` is an invalid choice, so the
    command imports the class's module and then runs the same `main()`: a Converter subclass registers
    itself in `Commandable.subclasses` when its module is imported, and `main()` builds its parser from that
    list. Run from the MindSpeed-MM root (where `checkpoint/` is), as every converter command is.
    """
    if conv.cli_registered:
        return ["mm-convert"]
    assert conv.module is not None  # the schema requires it with cli_registered: false
    return ["python", "-c", f"import {conv.module}; from checkpoint.convert_cli import main; main()"]


def converter_notes(conv: ConverterSpec) -> list[str]:
    """What a reader of a converter command needs to know about its program (`converter_program`)."""
    if conv.cli_registered:
        return []
    return [
        f"MindSpeed-MM's checkpoint/__init__.py does not import {conv.module}, so `mm-convert "
        f"{conv.class_name}` (the README's command) stops with an invalid choice: the command imports that "
        "module and then runs MindSpeed-MM's converter CLI (checkpoint.convert_cli.main) with the same arguments"
    ]


def first_stage(total: int, like: Layers) -> Layers:
    """`total` layers all on the first pipeline stage, shaped like `like` (flat, or nested per VPP chunk):
    where MindSpeed-MM's VLM converters put an encoder (ViT, audio) that precedes the LLM."""
    chunks = vpp_chunks(like)
    if chunks is not None:
        return [[total if (c, i) == (0, 0) else 0 for i in range(len(ch))] for c, ch in enumerate(chunks)]
    return [total if i == 0 else 0 for i in range(max(len(like), 1))]


def _vlm_parallel(
    prefix: str,
    tp: int,
    llm: Layers | None,
    vit: Layers | None,
    *,
    nested: bool,
    audio: Layers | None = None,
) -> list[str]:
    out: list[str] = []
    for name, values in (("llm_pp_layers", llm), ("vit_pp_layers", vit), ("audio_pp_layers", audio)):
        if values:
            shown = _layers_arg(values, nested) if nested else _list_arg(_flat_layers(values, name), False)
            out += [f"--cfg.{prefix}.{name}", shown]
    return [*out, f"--cfg.{prefix}.tp_size", str(tp)]


def converter_gap(conv: ConverterSpec, method: str, version: str) -> MMAgentError | None:
    """Why `mm-convert <class> <method>` does not exist at MindSpeed-MM `version` (None: it does).

    The registry records which releases' `checkpoint/` define the class and each later-added method; a
    command for a release without them would fail in mm-convert with an unknown class or subcommand. A
    method whose body upstream is a stub there (`converter.stubs`) would parse and then do nothing (or raise):
    it is no step either, and the stub's `fix` says what a user does instead.
    """
    if not conv.versions.contains(version):
        return MMAgentError(
            f"MindSpeed-MM {version} has no {conv.class_name} in checkpoint/ "
            f"(it ships in {conv.versions.describe()})",
            field="mm_version",
            fix=f"use a MindSpeed-MM version in {conv.versions.describe()}, or convert with that release's "
            "own example script",
        )
    if not conv.has_method(method, version):
        rng = conv.method_versions[method]
        return MMAgentError(
            f"{conv.class_name}.{method} is not in MindSpeed-MM {version} (it ships in {rng.describe()})",
            field="mm_version",
            fix=f"use a MindSpeed-MM version in {rng.describe()}",
        )
    stub = conv.stub_at(method, version)
    if stub is not None:
        return MMAgentError(
            f"{conv.class_name}.{method} is only a stub in MindSpeed-MM {version} (its body does nothing or "
            "raises NotImplementedError): that conversion does not exist there",
            field="mm_version",
            fix=stub.fix,
        )
    return None


def convert_command(
    entry: ModelEntry,
    size: SizeSpec,
    version: str,
    *,
    source: str,
    target: str,
    direction: Direction = "to_training",
    hf_dir: str | None = None,
    tp: int | None = None,
    pp_layers: list[int] | None = None,
    vit_pp_layers: list[int] | None = None,
    method: str | None = None,
    init_args: dict[str, str] | None = None,
    task: str | None = None,
) -> list[str]:
    """argv of the `mm-convert` call for this model (shared by the pipeline, `render_job`, `convert_weights`).

    `source` is the HF dir for `to_training` and the training save dir for `to_hf`; `hf_dir` is the
    original HF dir that `to_hf` copies configs from. tp/pp default to the size's recommended layout.
    `version` is checked against the registry so callers can't build a command for an unknown release.
    The argument shapes themselves live in `mm_convert_argv`. `method` (default: the direction's) and
    `init_args` (default: the model's) are what a model's steps data asks for (registry/data/steps/).
    The converter's `extra_args` for this method, size, `task` (None: only those for every task) and
    version follow, as upstream's README adds them. An omni model's audio encoder (`arch.audio_layers`) goes
    on the first stage like the ViT (without `audio_pp_layers` MindSpeed-MM's converter drops the audio
    weights: checkpoint/vlm_model/hf_to_mm.py:398 at 26.0.0 splits `audio_pp_layers or [[]]`).
    """
    get_registry().check_version(version)
    conv = entry.converter
    if conv is None:
        raise MMAgentError(
            f"{entry.id} has no mm-convert converter",
            field="converter",
            fix="this model loads Hugging Face weights directly; skip conversion",
        )
    if method is None:
        method = conv.to_training if direction == "to_training" else conv.to_hf
    if method is None:
        raise MMAgentError(
            f"{conv.class_name} has no export method",
            field="converter.to_hf",
            fix=f"use one of {', '.join(conv.methods)} by hand, or keep the training checkpoint",
        )
    gap = converter_gap(conv, method, version)
    if gap is not None:
        raise gap
    par = size.parallel
    vlm = is_vlm_converter(entry)
    audio: Layers | None = None
    if vlm:
        llm = pp_layers or par.llm_pp_layers or _arch_layers(size, "llm_layers")
        vit = vit_pp_layers or par.vit_pp_layers or _arch_layers(size, "vit_layers")
        audio_total = size.arch.get("audio_layers")
        if isinstance(audio_total, int) and method in (conv.to_training, conv.to_hf):
            audio = first_stage(audio_total, vit or llm or [])
    else:
        llm = pp_layers if pp_layers is not None else (par.pipeline_num_layers if par.pp > 1 else None)
        vit = None
    extra = [
        word
        for more in conv.extra_args
        if more.applies(method, size.id, task, version) and (task is not None or more.tasks is None)
        for word in more.args
    ]
    return [
        *mm_convert_argv(
            conv,
            method,
            vlm=vlm,
            source=source,
            target=target,
            hf_dir=hf_dir or convert_dirs(entry, size)[0],
            tp=tp if tp is not None else par.tp,
            pp_layers=llm,
            vit_pp_layers=vit,
            init_args=init_args,
            audio_pp_layers=audio,
        ),
        *extra,
    ]


def _arch_layers(size: SizeSpec, key: str) -> list[int] | None:
    value = size.arch.get(key)
    return [value] if isinstance(value, int) else None


# Raw-data shapes, most specific first: (task id), (template), (family). Text only; the tools that write
# data configs own the details.
_DATA_BY_TASK: dict[str, tuple[str, list[str]]] = {
    "dpo": (
        "Preference pairs: each sample has a chosen and a rejected output for the same prompt.",
        [
            "Generative DPO features carry `file_rejected`, `score`, `score_rejected` next to `file`.",
            "VLM DPO uses MLLM json with `chosen`/`rejected` answers.",
        ],
    ),
    "grpo": (
        "Prompts only: GRPO samples outputs online and scores them with a reward model.",
        ["Prepare a prompt list (text, plus images for VLM GRPO) and the reward model weights."],
    ),
}
_DATA_BY_TEMPLATE: dict[str, tuple[str, list[str]]] = {
    "accelerate_deepspeed": (
        "A folder of training images with captions (diffusers dreambooth/text_to_image layout).",
        [
            "Either an instance-image folder plus one prompt, or an `imagefolder` with metadata.jsonl "
            "(`file_name`, `text`)."
        ],
    ),
}
_DATA_BY_FAMILY: dict[str, tuple[str, list[str]]] = {
    "generative": (
        "data.txt lines `<dataset_root>,<path/to/data.json>`; data.json is a list of "
        '{"path": "videos/x.mp4", "cap": "caption", "num_frames": 81, "fps": 24, '
        '"resolution": {"height": 480, "width": 832}}.',
        [
            "`path` is relative to dataset_root (combine mode); `cap` may be a string or a list.",
            "Images use the same record shape with an image path.",
        ],
    ),
    "vlm": (
        'MLLM json: [{"messages": [{"role": "user", "content": "<image>question"}, '
        '{"role": "assistant", "content": "answer"}], "images": ["img/x.jpg"]}].',
        [
            "One `<image>` token per entry in `images`; videos use `<video>` and `videos`.",
            "Several datasets are comma-separated with no spaces.",
        ],
    ),
    "omni": (
        "MLLM json with messages plus `images`/`videos`/`audios` lists and matching `<image>`/`<video>`/"
        "`<audio>` tokens.",
        [],
    ),
    "audio": (
        "jsonl of audio clips with their transcript or text (one record per utterance).",
        ["Use the sample rate the model's processor expects; see the model's example README."],
    ),
    "post-training": (
        "Task-specific: see the example README (prompts for RL, pairs for preference tuning).",
        [],
    ),
}


def _data_format(entry: ModelEntry, task: TaskSpec) -> tuple[str, list[str]]:
    for table, key in (
        (_DATA_BY_TASK, task.id),
        (_DATA_BY_TEMPLATE, task.template),
        (_DATA_BY_FAMILY, entry.family),
    ):
        if key in table:
            return table[key]
    return ("See the model's example README for the data format.", [])


def _launch(launcher: str, script: str, nproc: int, nnodes: int) -> list[str]:
    """argv that starts `script` the way the stock example scripts do."""
    if script.endswith(".sh") or launcher == "bash":
        return ["bash", script]
    if launcher == "accelerate":
        return ["accelerate", "launch", script]
    if launcher == "python":
        return ["python", script]
    rank, addr = ("$NODE_RANK", "$MASTER_ADDR") if nnodes > 1 else ("0", "localhost")
    flags = f"--nproc_per_node {nproc} --nnodes {nnodes} --node_rank {rank} --master_addr {addr}"
    return ["torchrun", *flags.split(), "--master_port", "6000", script]


# Install commands come from the `install_deps` planner (mm_agent/install/plan.py), shown here as shell
# lines for an activated environment, run from the folder that holds the MindSpeed-MM checkout; the
# install tool runs the same steps with absolute paths and verifies each one.
_SUMMARY = Layout(mm_root="MindSpeed-MM", src_dir=".", env_path="$VIRTUAL_ENV", python="python", pip=("pip",))


@functools.lru_cache(maxsize=1)
def _summary_arch() -> Arch:
    """The install lines follow this machine's architecture (decord differs); x86_64 when it is neither."""
    try:
        return host_arch()
    except MMAgentError:
        return "x86_64"


def _install_steps(entry: ModelEntry, version: str) -> tuple[VersionInfo, list[PlanStep]]:
    reg = get_registry()
    info = reg.versions.get(reg.check_version(version))
    assert info is not None
    return info, build_steps(plan_context(entry, info, _SUMMARY, arch=_summary_arch(), registry=reg))


def _uses_base_paths(argv: list[str]) -> bool:
    roots = (_SUMMARY.mm_root, _SUMMARY.src_dir)
    return any(word == r or word.startswith(r + "/") for word in argv for r in roots)


def _shell_lines(steps: list[PlanStep], here: str) -> tuple[list[str], str]:
    """Shell lines for the steps' commands, with a `cd` wherever the working directory matters."""
    lines: list[str] = []
    for step in steps:
        for cmd in step.commands:
            where = cmd.cwd or "."
            if (cmd.cwd is not None or _uses_base_paths(cmd.argv)) and where != here:
                lines.append(_sh(["cd", posixpath.relpath(where, here)]))
                here = where
            lines.append(_sh(cmd.argv))
    return lines, here


def _manual_notes(steps: list[PlanStep]) -> list[str]:
    return [f"{s.title}: {'; '.join(s.instructions)}" for s in steps if s.manual]


def _env_setup(entry: ModelEntry, version: str) -> PipelineStage:
    info, steps = _install_steps(entry, version)
    ref = "master" if version == "master" else f"v{version}"
    base = [s for s in steps if s.stage == "env_setup"]
    lines, here = _shell_lines(base, ".")
    if here != _SUMMARY.mm_root:
        lines.append(_sh(["cd", posixpath.relpath(_SUMMARY.mm_root, here)]))
    cmds = [_sh(["source", script]) for script in info.cann_env] + lines
    notes = [f"Python {info.python}, torch {info.torch}, Megatron {info.megatron}."]
    notes += _manual_notes(base)
    notes.append(f"`mm-agent install {entry.id} --mm-version {version}` runs these steps with checks.")
    return PipelineStage(
        stage="env_setup",
        applies=True,
        summary=f"MindSpeed-MM {ref} with "
        + ", ".join(
            name
            for name, step_id in (
                ("torch/torch_npu", "torch-npu"),
                ("MindSpeed", "mindspeed"),
                ("Megatron", "megatron"),
            )
            if any(s.id == step_id for s in steps)
        )
        + " and CANN env",
        commands=cmds,
        notes=notes,
    )


def _model_deps(entry: ModelEntry, version: str) -> PipelineStage:
    _, steps = _install_steps(entry, version)
    overlay = entry.deps_for(version)
    mine = [s for s in steps if s.stage == "model_deps"]
    cmds, _ = _shell_lines(mine, _SUMMARY.mm_root)
    notes = [*(overlay.notes if overlay else []), *entry.conflicts]
    if overlay is not None and overlay.install_sh is not None:
        line = _sh(["bash", "scripts/install.sh", *overlay.install_sh])
        notes.append(f"The README's one-click `{line}` is what env_setup does, with pinned, checked steps.")
    notes += _manual_notes(mine)
    scripts = [overlay.requirements_file] if overlay and overlay.requirements_file else []
    scripts += overlay.scripts if overlay else []
    changes = overlay.base_changes() if overlay else []
    if cmds or any(s.manual for s in mine):
        summary = f"{entry.name} dependencies for MindSpeed-MM {version}"
    elif changes:
        summary = f"{entry.name}'s README changes the base install: {'; '.join(changes)}"
    else:
        summary = f"No model-specific dependencies for {entry.name} in {version}; base install only."
    return PipelineStage(
        stage="model_deps", applies=bool(cmds), commands=cmds, notes=notes, scripts=scripts, summary=summary
    )


def _weights(entry: ModelEntry, size: SizeSpec, version: str, task: str | None = None) -> PipelineStage:
    hf_dir = hf_dir_for(entry, size)
    cmds: list[str] = []
    notes: list[str] = []
    if size.hf_ids:
        cmds.append(_sh(["huggingface-cli", "download", size.hf_ids[0], "--local-dir", hf_dir]))
    else:
        notes.append(
            f"No Hugging Face id recorded for {entry.name} {size.id}: place the weights in {hf_dir}."
        )
    if entry.user is not None:  # a scaffolded DiT: only its base's encoders are downloaded
        notes.append(
            f"{size.hf_ids[0] if size.hf_ids else 'the base'}'s VAE, text encoder and tokenizer only; your DiT "
            "trains from its own initial weights (no conversion)."
        )
        return PipelineStage(
            stage="weights",
            applies=bool(cmds),
            commands=cmds,
            notes=notes,
            summary=f"Download the encoders {entry.name} uses",
        )
    if entry.converter is None:
        notes.append(f"{entry.name} loads Hugging Face weights directly: no mm-convert step.")
        return PipelineStage(
            stage="weights",
            applies=False,
            commands=cmds,
            notes=notes,
            summary=f"Download only; {entry.name} trains from the HF checkpoint",
        )
    source, target = convert_dirs(entry, size)
    conv = entry.converter
    gap = converter_gap(conv, conv.to_training, version)
    if gap is not None:
        notes.append(f"{gap.message}; fix: {gap.fix}")
    else:
        cmds.append(_sh(convert_command(entry, size, version, source=source, target=target, task=task)))
        notes += converter_notes(conv)
    notes += [n for n in entry.notes if "convert" in n.lower() or "load_path" in n.lower()]
    summary = (
        f"Download {size.id} weights and convert them with {conv.class_name}.{conv.to_training} "
        f"({conv.target_format} format)"
        if gap is None
        else f"Download {size.id} weights; no {conv.class_name}.{conv.to_training} conversion at {version}"
    )
    return PipelineStage(stage="weights", applies=True, commands=cmds, notes=notes, summary=summary)


def _data_prep(entry: ModelEntry, task: TaskSpec, size: SizeSpec) -> PipelineStage:
    summary, notes = _data_format(entry, task)
    data = {role: path for role, path in size.config_files.items() if "data" in role.lower()}
    mine = [path for role, path in data.items() if task.id in role.lower().split("_")]
    configs = mine or list(data.values())
    return PipelineStage(stage="data_prep", applies=True, summary=summary, scripts=configs, notes=list(notes))


def _feature_extraction(task: TaskSpec, version: str) -> PipelineStage:
    fe = task.feature_extraction
    if fe is None:
        return PipelineStage(
            stage="feature_extraction",
            applies=False,
            summary="No offline feature extraction: inputs are encoded during training",
        )
    if not fe.versions.contains(version):
        return PipelineStage(
            stage="feature_extraction",
            applies=False,
            scripts=[fe.script],
            summary=f"{fe.script} ships in MindSpeed-MM {fe.versions.describe()}, not in {version}",
            notes=["Use a version that ships the extractor, or the extractor of that version's example dir."],
        )
    return PipelineStage(
        stage="feature_extraction",
        applies=True,
        summary="Encode videos/captions once (VAE latents + text-encoder states) into .pt features",
        commands=[_sh(["bash", f"{fe.example_dir}/feature_extraction.sh"])],
        scripts=[fe.script, f"{fe.example_dir}/feature_extraction.sh"],
        notes=[
            "Writes <save_path>/data.jsonl and <save_path>/features/<name>.pt (save_path from tools.json).",
            "Training's data_folder must be save_path itself, not its features/ subfolder.",
        ],
    )


def _training(task: TaskSpec, version: str, nproc: int, nodes: int) -> PipelineStage:
    entry_path, example = task.entry_script.path, task.example_script
    notes = []
    if example and example != entry_path:
        notes.append(
            f"The stock launch script {example} holds the full argument list (render_job writes one)."
        )
    if not task.entry_script.versions.contains(version):
        notes.append(f"{entry_path} ships in {task.entry_script.versions.describe()}, not in {version}.")
    if nodes > 1:
        notes.append("Run the command on every node with NODE_RANK set and MASTER_ADDR = node 0's address.")
    return PipelineStage(
        stage="training",
        applies=True,
        commands=[_sh(_launch(task.launcher, entry_path, nproc, nodes))],
        scripts=list(dict.fromkeys(p for p in (entry_path, example) if p)),
        notes=notes + task.notes,
        summary=f"{task.id} ({task.backend}) with {entry_path} on {nodes}x{nproc} NPUs",
    )


def _inference(task: TaskSpec) -> PipelineStage:
    inf = task.inference_script
    if inf is None:
        return PipelineStage(stage="inference", applies=False, summary="No inference script for this task")
    return PipelineStage(
        stage="inference",
        applies=True,
        commands=[_sh(_launch(task.launcher, inf.path, 1, 1))],
        scripts=[inf.path],
        summary=f"Sample from the trained model with {inf.path}",
    )


def _export(entry: ModelEntry, size: SizeSpec, version: str) -> PipelineStage:
    conv = entry.converter
    if conv is None or conv.to_hf is None:
        why = (
            "your DiT has no Hugging Face layout to export to; its checkpoints are MindSpeed-MM's (torch_dcp)"
            if entry.user is not None
            else "the converter has no to-HF method"
            if conv
            else "training saves Hugging Face-format weights"
        )
        return PipelineStage(stage="export", applies=False, summary=f"No export step: {why}")
    target = f"ckpt/hf_export/{entry.id}-{size.id}"
    gap = converter_gap(conv, conv.to_hf, version)
    if gap is not None:
        return PipelineStage(
            stage="export", applies=False, summary=f"No export step: {gap.message}", notes=[gap.fix or ""]
        )
    argv = convert_command(entry, size, version, source="save_dir", target=target, direction="to_hf")
    notes = ["`save_dir` is the training --save folder.", *converter_notes(conv)]
    if conv.target_format == "dcp":
        notes.append(
            "DCP converters read one iteration: point --load_dir at the iteration folder, e.g. save_dir/iter_0005000/."
        )
    return PipelineStage(
        stage="export",
        applies=True,
        commands=[_sh(argv)],
        notes=notes,
        summary=f"Convert the trained checkpoint back to HF with {conv.class_name}.{conv.to_hf}",
    )


# ---------------------------------------------------------------------------------------------- bundled runtime
# The same eight stages for runtime=bundled: mm-agent renders the job (MindSpeed-MM's config files) and runs
# it with its own runtime (`python -m runtime.extract|train|sample` under torchrun) on NPU, GPU or CPU. Paths
# are `mm-agent render`'s defaults, so the lines work in order from one folder.


def bundled_convert_command(
    entry: ModelEntry, *, source: str, target: str, method: str = "hf_to_mm", hf_dir: str | None = None
) -> list[str]:
    """argv of `mm-agent convert` (native, streaming, atomic) for the bundled runtime's checkpoints."""
    if entry.converter is None:
        raise MMAgentError(f"{entry.id} has no converter", field="converter", fix="use a Wan-family model")
    argv = ["mm-agent", "convert", entry.converter.class_name, method, "--source", source, "--target", target]
    return [*argv, *(["--hf-dir", hf_dir] if hf_dir else []), "--yes"]


def _bundled_paths(entry: ModelEntry, task: TaskSpec, size: SizeSpec) -> dict[str, str]:
    weights = f"weights/{size.hf_ids[0] if size.hf_ids else entry.id}"
    return {
        "weights": weights,
        "load": f"{weights}-mm",
        "job": f"jobs/{entry.id}-{task.id}",
        "save": "checkpoints",
    }


def _bundled_stages(
    entry: ModelEntry, task: TaskSpec, size: SizeSpec, version: str, nproc: int, nodes: int
) -> list[PipelineStage]:
    why = bundled_refusal(entry, task, size)
    if why is not None:
        raise MMAgentError(why, field="runtime", fix="use runtime mindspeed-mm (MindSpeed-MM's own scripts)")
    info = get_registry().versions.get(version)
    assert info is not None  # build_pipeline's caller checked the version
    p = _bundled_paths(entry, task, size)
    job = p["job"]
    online = task.feature_extraction is None
    env = PipelineStage(
        stage="env_setup",
        applies=True,
        summary="mm-agent with its bundled runtime (torch, diffusers, transformers, megatron-core); "
        "no MindSpeed-MM checkout",
        commands=[
            "python3 -m venv .venv",
            ". .venv/bin/activate",
            _sh(["pip", "install", "-c", "constraints.txt", "-e", ".[runtime]"]),
        ],
        notes=[
            "Run in the mm-agent checkout; constraints.txt pins torch 2.13.0 (the CPU build on CPU machines).",
            "CUDA: install the CUDA build of that torch first. Ascend: add the npu extra (.[runtime,npu]); the "
            f"rendered scripts source the CANN env when it exists ({', '.join(info.cann_env)}).",
        ],
    )
    if is_bundled_vlm(entry):
        return [env, *_bundled_vlm_stages(entry, task, size, version, nproc, nodes)]
    deps = PipelineStage(
        stage="model_deps",
        applies=False,
        summary=f"{entry.name} needs nothing beyond the runtime extra (its VAE and text encoder load with "
        "diffusers/transformers)",
    )
    download = (
        [_sh(["huggingface-cli", "download", size.hf_ids[0], "--local-dir", p["weights"]])]
        if size.hf_ids
        else []
    )
    source = f"{p['weights']}/transformer"
    weights = PipelineStage(
        stage="weights",
        applies=True,
        summary=f"Download {size.id} weights and convert transformer/ to the MindSpeed-MM layout "
        f"({entry.converter.class_name if entry.converter else ''}.hf_to_mm, native)",
        commands=[*download, _sh(bundled_convert_command(entry, source=source, target=p["load"]))],
        notes=[
            "The converted checkpoint gets its own folder (the HF download stays untouched); it is the "
            "job's LOAD_PATH.",
            "The predictor in the job's configs is sized from transformer/config.json.",
        ],
    )
    summary, data_notes = _data_format(entry, task)
    render = ["mm-agent", "render", entry.id, "--task", task.id, "--size", size.id, "--runtime", "bundled"]
    render += ["--npus-per-node", str(nproc)] + (["--nnodes", str(nodes)] if nodes > 1 else [])
    render += ["--dataset-dir", "dataset", "--out", job]
    data = PipelineStage(
        stage="data_prep",
        applies=True,
        summary=summary,
        commands=[_sh(render), _sh(["mm-agent", "validate", job])],
        scripts=["data.txt", "data.json"]
        if online
        else ["feature_extract/data.txt", "feature_extract/data.json"],
        notes=[
            *data_notes,
            "Set --num-frames (4n+1), --max-height/--max-width (multiples of 16) and --text-len to your clips.",
        ],
    )
    if online:
        features = PipelineStage(
            stage="feature_extraction",
            applies=False,
            summary="No offline feature extraction: the VAE and text encoder run inside training "
            "(load_video_features: false)",
        )
    else:
        features = PipelineStage(
            stage="feature_extraction",
            applies=True,
            summary="Encode videos/captions once (VAE latents + UMT5 states) with python -m runtime.extract",
            commands=[_sh(["mm-agent", "extract", job, "--yes", "--wait"])],
            scripts=["feature_extract/feature_extraction.sh"],
            notes=[
                "Writes <feature_dir>/data.jsonl and features/<name>.pt in MindSpeed-MM's format; "
                "--skip-existing resumes an interrupted run.",
            ],
        )
    training = PipelineStage(
        stage="training",
        applies=True,
        summary=f"{task.id} with python -m runtime.train (FSDP2 data parallel) on {nodes}x{nproc} devices",
        commands=[_sh(["mm-agent", "train", job, "--yes", "--wait"])],
        scripts=["pretrain.sh"],
        notes=[
            "Picks NPU, then CUDA, then CPU (MM_AGENT_DEVICE or --device overrides); logs MindSpeed-MM's "
            "iteration lines, TensorBoard events and checkpoints in MM layout.",
        ],
    )
    inference = PipelineStage(
        stage="inference",
        applies=task.inference_script is not None,
        summary="Sample an mp4 from the trained checkpoint with python -m runtime.sample",
        commands=[_sh(["mm-agent", "sample", job, "--yes", "--wait"])] if task.inference_script else [],
        scripts=["inference.sh"] if task.inference_script else [],
    )
    target = f"ckpt/hf_export/{entry.id}-{size.id}"
    export_argv = bundled_convert_command(
        entry, source=p["save"], target=target, method="mm_to_hf", hf_dir=source
    )
    export = PipelineStage(
        stage="export",
        applies=True,
        summary="Convert the trained checkpoint back to diffusers (WanConverter.mm_to_hf)",
        commands=[_sh(export_argv)],
        notes=[f"`{p['save']}` is the job's --save folder."],
    )
    return [env, deps, weights, data, features, training, inference, export]


def _bundled_vlm_stages(
    entry: ModelEntry, task: TaskSpec, size: SizeSpec, version: str, nproc: int, nodes: int
) -> list[PipelineStage]:
    """Stages 2-8 of a Qwen2.5-VL job on the bundled runtime: the Hugging Face folder itself is converted
    (no `transformer/` subfolder), training runs transformers' model class, inference answers questions."""
    from mm_agent.dataset.formats import prepare_step  # (it imports the registry's data tables)

    p = _bundled_paths(entry, task, size)
    job, save = p["job"], f"{p['job']}/checkpoints"
    conv = entry.converter.class_name if entry.converter else ""
    deps = PipelineStage(
        stage="model_deps",
        applies=False,
        summary=f"{entry.name} needs nothing beyond the runtime extra (transformers' "
        "Qwen2_5_VLForConditionalGeneration and its processor)",
    )
    download = (
        [_sh(["huggingface-cli", "download", size.hf_ids[0], "--local-dir", p["weights"]])]
        if size.hf_ids
        else []
    )
    weights = PipelineStage(
        stage="weights",
        applies=True,
        summary=f"Download {size.id} weights and convert them to the MindSpeed-MM layout ({conv}.hf_to_mm, "
        "native)",
        commands=[*download, _sh(bundled_convert_command(entry, source=p["weights"], target=p["load"]))],
        notes=[
            "The converted checkpoint is the job's LOAD_PATH; the Hugging Face folder stays the processor and "
            "config source (data.json's model_name_or_path)."
        ],
    )
    prepare, what = prepare_step(entry.id, task.id, version, "dataset", task.backend)
    summary, data_notes = _data_format(entry, task)
    render = ["mm-agent", "render", entry.id, "--task", task.id, "--size", size.id, "--runtime", "bundled"]
    render += ["--npus-per-node", str(nproc)] + (["--nnodes", str(nodes)] if nodes > 1 else [])
    render += ["--dataset-dir", "dataset", "--out", job]
    data = PipelineStage(
        stage="data_prep",
        applies=True,
        summary=summary,
        commands=[*([_sh(prepare)] if prepare else []), _sh(render), _sh(["mm-agent", "validate", job])],
        scripts=["data.json", "model.json"],
        notes=[*data_notes, what],
    )
    features = PipelineStage(
        stage="feature_extraction",
        applies=False,
        summary="No offline feature extraction: the processor turns images into pixel_values during training",
    )
    training = PipelineStage(
        stage="training",
        applies=True,
        summary=f"{task.id} with python -m runtime.vlm_train (transformers' model class, FSDP2 data parallel) "
        f"on {nodes}x{nproc} devices",
        commands=[_sh(["mm-agent", "train", job, "--yes", "--wait"])],
        scripts=["finetune.sh"],
        notes=[
            "Picks NPU, then CUDA, then CPU; checkpoints in MindSpeed-MM's layout and names, resumed exactly "
            "when the job is started again.",
        ],
    )
    inference = PipelineStage(
        stage="inference",
        applies=True,
        summary="Answer the dataset's questions with the trained checkpoint (python -m runtime.vlm_infer, "
        "generate)",
        commands=[_sh(["mm-agent", "sample", job, "--yes", "--wait"])],
        scripts=["inference.sh"],
    )
    export_argv = bundled_convert_command(
        entry,
        source=save,
        target=f"ckpt/hf_export/{entry.id}-{size.id}",
        method="mm_to_hf",
        hf_dir=p["weights"],
    )
    export = PipelineStage(
        stage="export",
        applies=True,
        summary=f"Convert the trained checkpoint back to Hugging Face ({conv}.mm_to_hf)",
        commands=[_sh(export_argv)],
        notes=[f"`{save}` is the job's --save folder."],
    )
    return [deps, weights, data, features, training, inference, export]


def build_pipeline(
    entry: ModelEntry,
    task: TaskSpec,
    size: SizeSpec,
    version: str,
    *,
    npus_per_node: int | None = None,
    nnodes: int | None = None,
    runtime: Runtime = "mindspeed-mm",
) -> list[PipelineStage]:
    """The eight stages (schema.STAGES order) for this model/task/size at `version`.

    Stages that don't apply are returned with `applies=False` and a reason, so callers can show the whole
    picture; `npus_per_node`/`nnodes` override the size's recommended layout in the launch command.
    `runtime="bundled"` gives the stages of mm-agent's own runtime (Wan-family t2v; MMAgentError otherwise).
    """
    entry = entry.for_task(task)  # a task converted by its own converter (registry `tasks[].converter`)
    # the size's stock layout at this version (registry `changes`)
    stock = size.parallel_at(get_registry().check_version(version), task.id, task.backend)
    nproc = npus_per_node or stock.npus_per_node
    nodes = nnodes or stock.nnodes
    if runtime == "bundled":
        return _bundled_stages(entry, task, size, get_registry().check_version(version), nproc, nodes)
    from mm_agent.registry.steps import has_steps
    from mm_agent.stepplan import pipeline_stages  # (it builds on this module's argv builder)

    if has_steps(entry, version) and task.versions.contains(version):  # weights .. export: cited steps
        return [
            _env_setup(entry, version),
            _model_deps(entry, version),
            *pipeline_stages(entry, task, size, version, nproc, nodes),
        ]
    return [
        _env_setup(entry, version),
        _model_deps(entry, version),
        _weights(entry, size, version, task.id),
        _data_prep(entry, task, size),
        _feature_extraction(task, version),
        _training(task, version, nproc, nodes),
        _inference(task),
        _export(entry, size, version),
    ]
