"""Typed shape of the model registry.

The registry is data (one YAML file per MindSpeed-MM `examples/` directory, plus `versions.yaml`);
these pydantic models are the contract that data must meet. Everything is frozen and `extra="forbid"`
so a typo in a data file fails at load time with the file and field named, not later inside a tool.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal, get_args

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from mm_agent.registry.deps import BaseStep, ModelAction, ReadmeDeviation
from mm_agent.registry.tokens import AbsPath, GitRef, HttpsUrl, PipRequirement, RelPath

Family = Literal["vlm", "generative", "omni", "audio", "post-training"]
Backend = Literal["megatron", "megatron+fsdp2", "fsdp2-native", "accelerate+deepspeed", "custom"]
TaskId = Literal[
    "t2v",
    "i2v",
    "ti2v",
    "v2v",
    "flf2v",
    "t2i",
    "i2i",
    "sft",
    "lora",
    "dpo",
    "grpo",
    "pretrain",
    "asr",
    "tts",
]
Status = Literal["verified", "supported", "preview", "inference-only"]
TemplateSet = Literal[
    "megatron_generative",  # Megatron DiT trained on extracted features (Wan2.1 style)
    "megatron_fsdp2_generative",  # Megatron + FSDP2 DiT with online encoding (Wan2.2 / HunyuanVideo1.5 style)
    "megatron_vlm",  # pretrain_vlm.py with data.json + model.json
    "transformers_fsdp2",  # pretrain_transformers.py <yaml> (Qwen3-VL style)
    "fsdp2_native",  # mindspeed_mm/fsdp/train/trainer.py <yaml>
    "accelerate_deepspeed",  # accelerate launch of a diffusers/DiffSynth training script
    "custom",  # model-specific trainer launched with torchrun/python
    "user_dit",  # a user's DiT scaffolded by `mm-agent new-model` (MindSpeed-MM's new-model guide)
]
ConverterFormat = Literal["mm", "dcp"]
Stage = Literal[
    "env_setup",
    "model_deps",
    "weights",
    "data_prep",
    "feature_extraction",
    "training",
    "inference",
    "export",
]
STAGES: tuple[Stage, ...] = get_args(Stage)
GitRefAdapter: TypeAdapter[str] = TypeAdapter(GitRef)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


@functools.lru_cache(maxsize=512)
def version_key(version: str) -> tuple[int, ...]:
    """Order MindSpeed-MM versions; `master` sorts after every release. Remembered: routing compares the
    same few versions hundreds of times a call."""
    if version == "master":
        return (10**6,)
    return tuple(int(p) for p in version.split("."))


class VersionRange(_Frozen):
    """Inclusive range of MindSpeed-MM versions in which something exists."""

    since: str = "1.0.0"
    until: str | None = Field(
        default=None, description="last version that still has it; None = still present"
    )

    def contains(self, version: str) -> bool:
        key = version_key(version)
        if key < version_key(self.since):
            return False
        return self.until is None or key <= version_key(self.until)

    def describe(self) -> str:
        return f"{self.since}–{self.until}" if self.until else f"{self.since} and later (incl. master)"


class ScriptRef(_Frozen):
    """A script inside a MindSpeed-MM checkout, and the versions that ship it."""

    path: str
    versions: VersionRange = VersionRange()


class FeatureExtraction(_Frozen):
    script: str = Field(description="feature-extraction entry, relative to the MindSpeed-MM root")
    example_dir: str = Field(description="folder of the stock feature-extraction configs")
    versions: VersionRange = VersionRange()


class ConverterStub(_Frozen):
    """A converter method whose body upstream is a stub: the versions where it is, and what a user does instead."""

    versions: VersionRange = VersionRange()
    fix: str = Field(
        min_length=10,
        description="the manual path upstream documents instead, or that the conversion does not exist there",
    )


_FLAG = r"^--[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class ConvertArgs(_Frozen):
    """Flags a conversion method takes beyond the generic command (paths, layout), where upstream's README
    adds them: Qwen3.5-4B's `--tie_weight_mapping` at 26.0.0, DeepSeek-VL2's `--cfg.parallel_config.ep_size`."""

    method: str
    args: list[str] = Field(min_length=2, description="flag, value, flag, value, ... (argv words, no shell)")
    sizes: list[str] | None = Field(default=None, description="None = every size")
    tasks: list[TaskId] | None = Field(default=None, description="None = every task")
    versions: VersionRange = VersionRange()
    source: str = Field(min_length=10, description="where upstream says so, path:line at the version")

    @field_validator("args")
    @classmethod
    def _flag_value_pairs(cls, value: list[str]) -> list[str]:
        if len(value) % 2 or not all(re.match(_FLAG, flag) for flag in value[::2]):
            raise ValueError(f"args must be --flag value pairs, got {value}")
        return value

    def applies(self, method: str, size: str, task: str | None, version: str) -> bool:
        return (
            self.method == method
            and (self.sizes is None or size in self.sizes)
            and (self.tasks is None or task in self.tasks)
            and self.versions.contains(version)
        )


class ConverterSpec(_Frozen):
    """`mm-convert` converter class and the methods it exposes."""

    class_name: str = Field(alias="class")
    methods: list[str]
    target_format: ConverterFormat
    to_training: str = Field(description="method that turns HF weights into the training format")
    to_hf: str | None = Field(default=None, description="method that exports trained weights back to HF")
    arg_style: Literal["cfg", "flat"] = Field(description="`--cfg.*` (pydantic cfg) or flat flags")
    init_args: dict[str, str] = Field(default_factory=dict, description="e.g. {version: t2v}")
    versions: VersionRange = Field(
        default=VersionRange(), description="MindSpeed-MM versions whose checkpoint/ defines the class"
    )
    method_versions: dict[str, VersionRange] = Field(
        default_factory=dict,
        description="methods added or removed inside the class's range (method -> versions that have it)",
    )
    path_methods: list[str] = Field(
        default_factory=list,
        description="methods whose cfg is only --cfg.source_path/--cfg.target_path (a VAE or text-encoder "
        "conversion with no parallel layout, e.g. OpenSoraPlanConverter.vae_convert)",
    )
    cli_registered: bool = Field(
        default=True,
        description="False: MindSpeed-MM's checkpoint/__init__.py never imports the class's module, so "
        "`mm-convert <class>` cannot find it (the README's command fails) and the module must be imported first",
    )
    module: str | None = Field(
        default=None,
        pattern=r"^checkpoint(\.[A-Za-z_][A-Za-z0-9_]*)+$",
        description="the checkpoint/ module that defines the class; required when cli_registered is false: the "
        "command imports it and then runs MindSpeed-MM's CLI (`python -c 'import <module>; from "
        "checkpoint.convert_cli import main; main()' <class> ...`)",
    )
    stubs: dict[str, ConverterStub] = Field(
        default_factory=dict,
        description="methods whose body upstream is a stub (`pass`, `...`, only a docstring, `raise "
        "NotImplementedError`) at some versions: never offered as a step there",
    )
    extra_args: list[ConvertArgs] = Field(
        default_factory=list,
        description="arguments a method needs beyond the generic command, as upstream's README gives them",
    )

    @model_validator(mode="after")
    def _methods_exist(self) -> ConverterSpec:
        if not self.cli_registered and self.module is None:
            raise ValueError("cli_registered: false needs `module` (the checkpoint module to import first)")
        for named in (*self.stubs, *(a.method for a in self.extra_args)):
            if named not in self.methods:
                raise ValueError(f"converter method {named!r} is not in methods {self.methods}")
        for name in (self.to_training, self.to_hf, *self.method_versions, *self.path_methods):
            if name is not None and name not in self.methods:
                raise ValueError(f"converter method {name!r} is not in methods {self.methods}")
        if self.to_training in self.method_versions:
            raise ValueError(
                f"to_training method {self.to_training!r} must exist wherever the converter does: "
                "narrow the converter's versions instead of listing it in method_versions"
            )
        return self

    def stub_at(self, name: str, version: str) -> ConverterStub | None:
        """The stub record when MindSpeed-MM `version`'s `name` is only a stub (nothing to run)."""
        stub = self.stubs.get(name)
        return stub if stub is not None and stub.versions.contains(version) else None

    def has_method(self, name: str, version: str) -> bool:
        """Whether MindSpeed-MM `version` offers `name` on this converter."""
        rng = self.method_versions.get(name)
        return (
            name in self.methods
            and self.versions.contains(version)
            and (rng is None or rng.contains(version))
        )


class Parallel(_Frozen):
    """Recommended parallel layout for one model size (MindSpeed-MM example defaults)."""

    npus_per_node: int = Field(default=8, ge=1, le=16)
    nnodes: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    vpp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    mbs: int = Field(default=1, ge=1)
    grad_acc: int = Field(default=1, ge=1)
    pipeline_num_layers: list[int] | None = Field(
        default=None, description="DiT layers per PP stage (Megatron generative models)"
    )
    llm_pp_layers: list[int] | None = Field(default=None, description="VLM: LLM layers per PP stage")
    vit_pp_layers: list[int] | None = Field(default=None, description="VLM: ViT layers per PP stage")

    @model_validator(mode="after")
    def _lists_match_pp(self) -> Parallel:
        for name in ("pipeline_num_layers", "llm_pp_layers", "vit_pp_layers"):
            value = getattr(self, name)
            if value is not None and self.pp > 1 and len(value) != self.pp:
                raise ValueError(f"{name} has {len(value)} entries but pp={self.pp}")
        return self


class SizeChange(_Frozen):
    """Where the stock example of part of a size's versions (or of one of its tasks) differs from the size's own
    `parallel` / `arch`: the values it sets there, so each version renders its own stock example (Qwen3.5-27B:
    MindSpeed-MM 26.0.0's launcher runs 2 nodes x 8 NPUs at micro batch 1, 26.1.0's one node of 16 at 2)."""

    versions: VersionRange = VersionRange()
    task: TaskId | None = Field(default=None, description="None = every task")
    backend: Backend | None = Field(default=None, description="None = every backend")
    parallel: dict[str, Any] = Field(default_factory=dict, description="Parallel fields set there")
    arch: dict[str, Any] = Field(
        default_factory=dict, description="top-level arch keys set there (null = the key is left out)"
    )
    source: str = Field(min_length=10, description="the stock file(s) that say so, path:line at the version")

    @model_validator(mode="after")
    def _sets_something(self) -> SizeChange:
        if not self.parallel and not self.arch:
            raise ValueError("a change sets parallel or arch values")
        unknown = sorted(set(self.parallel) - set(Parallel.model_fields))
        if unknown:
            raise ValueError(f"parallel names {unknown}, not Parallel fields {sorted(Parallel.model_fields)}")
        return self

    def applies(self, version: str, task: str | None, backend: str | None) -> bool:
        return (
            self.versions.contains(version)
            and (self.task is None or self.task == task)
            and (self.backend is None or self.backend == backend)
        )


class SizeSpec(_Frozen):
    id: str = Field(description="size id as used in the examples tree, e.g. 1.3b, 14b, 3b")
    hf_ids: list[str] = Field(default_factory=list, description="Hugging Face repo ids of this size")
    params: str | None = Field(
        default=None,
        pattern=r"^\d+(\.\d+)?b$",
        description="the parameter count a request names (e.g. 5b) where the size id is something else: a model "
        "version (CogVideoX 1.0, 1.5) or `default`; one of hf_ids must name it",
    )
    parallel: Parallel = Field(default_factory=Parallel)
    arch: dict[str, Any] = Field(
        default_factory=dict, description="architecture numbers the templates write (layers, heads, dims)"
    )
    config_files: dict[str, str] = Field(
        default_factory=dict,
        description="stock config files in the MindSpeed-MM checkout this size is rendered from (role -> path)",
    )
    config_file_versions: dict[str, VersionRange] = Field(
        default_factory=dict,
        description="roles whose file ships in only part of the size's range (role -> versions that have it)",
    )
    changes: list[SizeChange] = Field(
        default_factory=list,
        description="where a version's (or a task's) stock example sets other parallel/arch values; in order",
    )
    versions: VersionRange = VersionRange()

    @model_validator(mode="after")
    def _params_named_by_a_repo(self) -> SizeSpec:
        if self.params is not None and self.hf_ids:
            named = re.compile(rf"(?<![\d.]){re.escape(self.params)}\b", re.I)
            if not any(named.search(h.split("/")[-1].replace("_", "-")) for h in self.hf_ids):
                raise ValueError(f"params {self.params!r} is named by none of hf_ids {self.hf_ids}")
        return self

    @model_validator(mode="after")
    def _ranged_roles_exist(self) -> SizeSpec:
        unknown = sorted(set(self.config_file_versions) - set(self.config_files))
        if unknown:
            raise ValueError(
                f"config_file_versions names {unknown}, which are not config_files roles {sorted(self.config_files)}"
            )
        for change in self.changes:
            # the layout each change makes must itself be a valid one (pp lists match pp, sizes >= 1)
            Parallel.model_validate({**self.parallel.model_dump(exclude_unset=True), **change.parallel})
        return self

    def parallel_at(self, version: str, task: str | None = None, backend: str | None = None) -> Parallel:
        """The stock layout of this size at `version` (for `task` / `backend`): `parallel` with the `changes`
        that apply there."""
        sets = [c.parallel for c in self.changes if c.parallel and c.applies(version, task, backend)]
        if not sets:
            return self.parallel
        values = self.parallel.model_dump(exclude_unset=True)
        for one in sets:
            values.update(one)
        return Parallel.model_validate(values)

    def arch_at(self, version: str, task: str | None = None, backend: str | None = None) -> dict[str, Any]:
        """`arch` at `version` (for `task` / `backend`), with the `changes` that apply there (null drops a key)."""
        arch = dict(self.arch)
        for change in self.changes:
            if change.applies(version, task, backend):
                for key, value in change.arch.items():
                    if value is None:
                        arch.pop(key, None)
                    else:
                        arch[key] = value
        return arch

    def config_files_at(self, version: str) -> dict[str, str]:
        """The config files (role -> path) that MindSpeed-MM `version` ships for this size."""
        return {
            role: path
            for role, path in self.config_files.items()
            if self.versions.contains(version)
            and (role not in self.config_file_versions or self.config_file_versions[role].contains(version))
        }


class EvalBenchmark(_Frozen):
    """A benchmark MindSpeed-MM's evaluation entry scores: the `evaluation_dataset` name its eval_datasets /
    eval_impl tables know, and the TSV file the model README links for download."""

    id: str = Field(pattern=r"^[a-z0-9_]+$", description="evaluation_dataset value, e.g. ai2d_test")
    file: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+\.tsv$", description="the downloaded file's name, e.g. AI2D_TEST.tsv"
    )
    url: HttpsUrl


class Evaluation(_Frozen):
    """How a task's trained checkpoint is evaluated with MindSpeed-MM (evaluate.sh + evaluate_model.json)."""

    script: ScriptRef = Field(description="the evaluation entry, relative to the MindSpeed-MM root")
    model: str = Field(
        pattern=r"^[a-z0-9_]+$",
        description="evaluation_model: the key of eval_pipeline_dict that builds the pipeline",
    )
    benchmarks: list[EvalBenchmark] = Field(min_length=1, description="the first is the stock config's")


class TrainDefaults(_Frozen):
    """The stock launcher's training length, learning rate, DataLoader workers and checkpoint interval: what a
    job renders when the request leaves the field unset (None = mm-agent's generic value, jobspec.py)."""

    train_iters: int | None = Field(default=None, ge=1, le=1_000_000_000)
    lr: float | None = Field(default=None, gt=0, le=10, allow_inf_nan=False)
    num_workers: int | None = Field(default=None, ge=0, le=64)
    save_interval: int | None = Field(default=None, ge=1, le=1_000_000_000)


class TrainDefaultsChange(TrainDefaults):
    """Stock values that changed in a later version (the fields set here replace train_defaults' from `since`)."""

    since: str


class AdaptedTask(_Frozen):
    """Another model a LoRA task's stock examples adapt besides its `weights_of` (Wan2.1 14B ships both
    t2v/ and i2v/finetune_lora.sh): the same adapter and flags on that task's weights and configs."""

    weights_of: TaskId = Field(description="the task whose weights and model config the adapter trains on")
    example_script: str = Field(description="its stock launch script in examples/")
    sizes: list[str] | None = Field(default=None, description="sizes it exists for; None = all")


class TaskSpec(_Frozen):
    id: TaskId
    backend: Backend
    template: TemplateSet
    entry_script: ScriptRef
    example_script: str | None = Field(default=None, description="stock launch script in examples/")
    readme_section: str | None = Field(
        default=None,
        min_length=2,
        description="heading of the model's examples README whose steps turn example_script into this task "
        "(e.g. LoRA arguments added to the SFT script); None: the script alone is the task",
    )
    inference_script: ScriptRef | None = None
    evaluation: Evaluation | None = Field(
        default=None, description="the README's evaluation of the trained checkpoint (evaluate.sh), if any"
    )
    weights_of: TaskId | None = Field(
        default=None,
        description="the task whose Hugging Face repo (of the size's hf_ids) this task starts from, e.g. "
        "a LoRA of the i2v model; None = this task's own",
    )
    also_adapts: list[AdaptedTask] = Field(
        default_factory=list,
        description="a LoRA: the other tasks' models its stock examples adapt (a job picks one with `adapts`)",
    )
    feature_extraction: FeatureExtraction | None = None
    sizes: list[str] | None = Field(default=None, description="sizes this task exists for; None = all")
    versions: VersionRange = VersionRange()
    launcher: Literal["torchrun", "accelerate", "python", "bash"] = "torchrun"
    train_defaults: TrainDefaults = Field(
        default_factory=TrainDefaults,
        description="the stock example_script's train_iters / lr / num_workers / save_interval where they differ "
        "from mm-agent's generic values (a size's arch.task_defaults and the request override them)",
    )
    train_defaults_changes: list[TrainDefaultsChange] = Field(
        default_factory=list,
        description="where a later version's stock example changed these values: the fields each entry sets, "
        "from its `since` on (entries in version order)",
    )
    converter: ConverterSpec | None = Field(
        default=None,
        description="the converter this task's training loads from when it is not the model's (Qwen3-VL's "
        "fsdp2-native trainer keeps Hugging Face names: GenericDCPConverter, examples/qwen3vl/README_v1.md)",
    )
    notes: list[str] = Field(default_factory=list)

    def adapted(self) -> list[str]:
        """The tasks whose models this task adapts: its `weights_of`, then `also_adapts` ([] for none)."""
        return [t for t in [self.weights_of, *(a.weights_of for a in self.also_adapts)] if t is not None]

    def adapting(self, target: str) -> TaskSpec | None:
        """This task as the job that adapts `target`'s model: the weights, configs and stock script of that
        one (templates and steps read `weights_of` and `example_script`); None when its examples have none."""
        if target == self.weights_of:
            return self
        extra = next((a for a in self.also_adapts if a.weights_of == target), None)
        if extra is None:
            return None
        update = {"weights_of": extra.weights_of, "example_script": extra.example_script}
        return self.model_copy(update=update | {"sizes": extra.sizes, "also_adapts": []})

    def train_defaults_at(self, version: str) -> TrainDefaults:
        """The stock train values of this task's example at `version`."""
        values = self.train_defaults.model_dump()
        for change in self.train_defaults_changes:
            if version_key(version) >= version_key(change.since):
                values.update(change.model_dump(exclude={"since"}, exclude_none=True))
        return TrainDefaults(**values)


class GitSource(_Frozen):
    """A source checkout a model's README installs with `git clone; git checkout <ref>; pip install -e .`."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="checkout folder name")
    url: HttpsUrl
    ref: GitRef


# `scripts/install.sh` options (MindSpeed-MM scripts/install.sh, reference §6.2): flag -> takes a value.
INSTALL_SH_OPTIONS: dict[str, bool] = {
    "--megatron": False,
    "-mt": False,
    "--msid": True,
    "-m": True,
    "--msbranch": True,
    "-b": True,
    "--torchversion": True,
    "-t": True,
    "--yes": False,
    "-y": False,
    "--no": False,
    "-n": False,
}
_INSTALL_SH_ALIASES = {"-mt": "--megatron", "-m": "--msid", "-b": "--msbranch", "-t": "--torchversion"}


class DepsOverlay(_Frozen):
    """Model-specific install steps on top of the base MindSpeed-MM install, for a range of versions.

    Every string here reaches a command line, so each has a strict type (registry/tokens.py); there is no
    free-form shell. Simple overlays list `pip` pins (after an optional `requirements_file`), `git_sources`
    and `scripts`; an overlay whose README does more, or in another order, lists its commands as `steps`
    (registry/deps.py), in README order. The fields after `steps` say where the README's base install
    differs from MindSpeed-MM's install guide (its MindSpeed ref and how it installs it, Megatron's tag, base
    steps it leaves out); tests/fidelity/test_install_readme.py compares the resulting plan with the README.
    """

    versions: VersionRange = VersionRange()
    pip: list[PipRequirement] = Field(
        default_factory=list,
        description="PEP 508 requirements, in install order (git pins as name @ git+https://…@ref)",
    )
    requirements_file: RelPath | None = Field(
        default=None, description="requirements file in the MM checkout"
    )
    install_sh: list[str] | None = Field(
        default=None, description="arguments of the README's `bash scripts/install.sh` line"
    )
    mindspeed_commit: GitRef | None = None
    scripts: list[RelPath] = Field(
        default_factory=list, description="install scripts in the MM checkout, run with bash from its root"
    )
    git_sources: list[GitSource] = Field(
        default_factory=list, description="source checkouts to pip install -e"
    )
    notes: list[str] = Field(default_factory=list)
    steps: list[ModelAction] = Field(
        default_factory=list, description="the README's install commands in its order (instead of the slots)"
    )
    mindspeed_branch: GitRef | None = Field(
        default=None, description="the MindSpeed branch the README clones (`git clone -b <branch>`)"
    )
    mindspeed_install: Literal["pip", "copy"] = Field(
        default="pip",
        description="copy: the README copies MindSpeed's `mindspeed/` package into the MindSpeed-MM checkout "
        "(`cp -r mindspeed ../MindSpeed-MM/`) instead of `pip install -e`",
    )
    megatron_ref: GitRef | None = Field(default=None, description="the Megatron-LM tag the README checks out")
    omit: list[BaseStep] = Field(
        default_factory=list, description="base steps the README does not do (it runs without them)"
    )
    mm_install_last: bool = Field(
        default=False,
        description="the README installs MindSpeed-MM (`pip install -e .`) after the model's steps",
    )
    readme_deviations: list[ReadmeDeviation] = Field(
        default_factory=list, description="README commands the plan does not follow as written, and why"
    )

    def pins(self) -> list[str]:
        """Every requirement this overlay leaves installed, including what its files and scripts are known to
        hold; where a later step installs the same package again, its requirement is the one kept."""
        out = list(self.pip)
        for action in self.steps:
            out += [*action.pip, *action.holds, *(action.script.installs if action.script else [])]
        last = {canonicalize_name(Requirement(r).name): r for r in out}
        return [r for r in out if last[canonicalize_name(Requirement(r).name)] == r]

    def base_changes(self) -> list[str]:
        """How the README's base install differs from the install guide's, in words (empty: it does not)."""
        out: list[str] = []
        branch = self.install_sh_option("--msbranch")
        if self.mindspeed_commit:
            out.append(f"MindSpeed at {self.mindspeed_commit[:8]}")
        elif self.mindspeed_branch or isinstance(branch, str):
            out.append(f"MindSpeed branch {self.mindspeed_branch or branch}")
        if self.mindspeed_install == "copy":
            out.append("MindSpeed's package copied into the checkout instead of pip-installed")
        if self.megatron_ref:
            out.append(f"Megatron-LM {self.megatron_ref}")
        if (
            self.install_sh is not None
            and not self.install_sh_option("--megatron")
            and "megatron" not in self.omit
        ):
            out.append("no Megatron (its install.sh line has no --megatron)")
        if self.omit:
            out.append("without " + ", ".join(self.omit))
        if self.mm_install_last:
            out.append("MindSpeed-MM installed after the model's own steps")
        return out

    @model_validator(mode="after")
    def _steps_are_consistent(self) -> DepsOverlay:
        if self.steps and (self.pip or self.requirements_file or self.scripts or self.git_sources):
            raise ValueError(
                "an overlay with `steps` lists every command there (no pip/requirements_file/...)"
            )
        known = {"mm"}
        manual_ids: set[str] = set()
        for action in self.steps:
            unknown = [p for p in action.places() if p not in known]
            if unknown:
                raise ValueError(f"step {action.kind} refers to {unknown}: not mm nor an earlier clone")
            if action.clone is not None:
                if action.clone.name in known:
                    raise ValueError(f"clone name {action.clone.name!r} is used twice")
                known.add(action.clone.name)
            if action.manual is not None:
                if action.manual.id in manual_ids:
                    raise ValueError(f"manual step id {action.manual.id!r} is used twice")
                manual_ids.add(action.manual.id)
        if self.mindspeed_branch and self.mindspeed_commit:
            raise ValueError("mindspeed_branch and mindspeed_commit exclude each other")
        branch = self.install_sh_option("--msbranch")
        if isinstance(branch, str) and self.mindspeed_branch not in (None, branch):
            raise ValueError(
                f"install.sh --msbranch {branch} differs from mindspeed_branch {self.mindspeed_branch}"
            )
        return self

    @field_validator("install_sh")
    @classmethod
    def _known_install_sh_options(cls, value: list[str] | None) -> list[str] | None:
        args = list(value or [])
        while args:
            flag = args.pop(0)
            if flag not in INSTALL_SH_OPTIONS:
                raise ValueError(
                    f"unknown scripts/install.sh option {flag!r}; known: {sorted(INSTALL_SH_OPTIONS)}"
                )
            if INSTALL_SH_OPTIONS[flag]:
                if not args:
                    raise ValueError(f"scripts/install.sh option {flag} needs a value")
                GitRefAdapter.validate_python(args.pop(0))
        return value

    def install_sh_option(self, name: str) -> str | bool | None:
        """Value of an install.sh option (long name), True for a set flag, None when absent."""
        args = list(self.install_sh or [])
        while args:
            flag = _INSTALL_SH_ALIASES.get(args[0], args[0])
            takes_value = INSTALL_SH_OPTIONS[args.pop(0)]
            value = args.pop(0) if takes_value else True
            if flag == name:
                return value
        return None

    @model_validator(mode="after")
    def _msid_matches_commit(self) -> DepsOverlay:
        msid = self.install_sh_option("--msid")
        if isinstance(msid, str) and self.mindspeed_commit not in (None, msid):
            raise ValueError(
                f"install.sh --msid {msid} differs from mindspeed_commit {self.mindspeed_commit}"
            )
        return self


class UserModel(_Frozen):
    """A model the user scaffolded with `mm-agent new-model` (MindSpeed-MM's new-model guide): where its code is and
    what MindSpeed-MM calls it. Only workspace registry entries (`.mm-agent/models/`) have one."""

    code_root: str = Field(description="the checkout written into, or the overlay folder")
    mode: Literal["checkout", "overlay"]
    base: str = Field(description="the new_model.yaml base its VAE, text encoder and sizes came from")
    mm_version: str
    model_id: str = Field(description="its key in PREDICTOR_MODEL_MAPPINGS (model.json predictor.model_id)")
    predictor_class: str
    model_class: str
    dataset_class: str
    files: dict[str, str] = Field(description="role -> path relative to code_root (dit, model_config, ...)")


class ModelEntry(_Frozen):
    id: str = Field(description="MindSpeed-MM examples/ directory name (diffusers/flux -> flux)")
    name: str
    family: Family
    description: str
    example_dir: str
    skill: str
    status: Status
    versions: VersionRange
    aliases: list[str] = Field(default_factory=list)
    sizes: list[SizeSpec] = Field(min_length=1)
    tasks: list[TaskSpec] = Field(min_length=1)
    converter: ConverterSpec | None = None
    deps: list[DepsOverlay] = Field(default_factory=list)
    conflicts: list[str] = Field(
        default_factory=list, description="known dependency clashes with other models"
    )
    notes: list[str] = Field(default_factory=list)
    user: UserModel | None = Field(default=None, description="set only for a user's scaffolded model")

    @field_validator("id")
    @classmethod
    def _id_format(cls, value: str) -> str:
        if not value or value != value.strip() or "/" in value or value.lower() != value:
            raise ValueError("id must be the lower-case examples/ directory name without slashes")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        size_ids = [s.id for s in self.sizes]
        if len(set(size_ids)) != len(size_ids):
            raise ValueError(f"duplicate size ids in {size_ids}")
        keys = [(t.id, t.backend) for t in self.tasks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate (task, backend) pairs in {keys}")
        for task in self.tasks:
            for size in [*(task.sizes or []), *(s for a in task.also_adapts for s in a.sizes or [])]:
                if size not in size_ids:
                    raise ValueError(f"task {task.id} names size {size!r}, not one of {size_ids}")
            for target in task.adapted():
                if self.task(target) is None:
                    raise ValueError(f"task {task.id} adapts {target!r}, not a task of {self.id}")
        for size_spec in self.sizes:
            for change in size_spec.changes:
                if change.task is not None and self.task(change.task, change.backend) is None:
                    raise ValueError(
                        f"size {size_spec.id}: a change names task {change.task} ({change.backend or 'any backend'}), "
                        f"not one of {keys}"
                    )
        return self

    def task(self, task_id: str, backend: str | None = None) -> TaskSpec | None:
        for task in self.tasks:
            if task.id == task_id and (backend is None or task.backend == backend):
                return task
        return None

    def size(self, size_id: str) -> SizeSpec | None:
        return next((s for s in self.sizes if s.id == size_id.lower()), None)

    def for_task(self, task: TaskSpec) -> ModelEntry:
        """This model as `task` sees it: the task's own converter in place of the model's, where it has one
        (what its weights are converted with is what its training loads)."""
        if task.converter is None:
            return self
        return self.model_copy(update={"converter": task.converter})

    def deps_for(self, version: str) -> DepsOverlay | None:
        return next((d for d in self.deps if d.versions.contains(version)), None)


class UnregisteredExample(_Frozen):
    """An `examples/` directory of some MindSpeed-MM version that deliberately has no model file, and why."""

    dir: str = Field(
        pattern=r"^examples/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$",
        description="path from the MindSpeed-MM root",
    )
    kind: Literal["container", "not-a-model", "retired"] = Field(
        description="container: its sub-folders are the models (diffusers/); not-a-model: a backend, plugin or "
        "tooling folder; retired: a model MindSpeed-MM dropped before the registry's default version"
    )
    versions: VersionRange = Field(description="the versions whose examples/ have it")
    reason: str = Field(min_length=20)


class UnregisteredExamples(_Frozen):
    dirs: list[UnregisteredExample] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> UnregisteredExamples:
        names = [d.dir for d in self.dirs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate dirs in {sorted(n for n in names if names.count(n) > 1)}")
        return self


class VersionInfo(_Frozen):
    id: str
    released: str
    mindspeed_branch: GitRef | None = None
    megatron: GitRef = "core_v0.12.1"
    torch: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    torch_npu: str | None = Field(
        default=None, description="TorchNPU release (the product version, e.g. 26.0.0)"
    )
    cann: str | None = None
    python: str = Field(default="3.10", pattern=r"^3\.\d+$")
    cann_env: list[AbsPath] = Field(description="set_env.sh scripts to source, in order")
    base_pins: dict[str, str] = Field(description="pins of the base pyproject.toml (package -> specifier)")
    root_entry_points: list[str]


class VersionTable(_Frozen):
    default: str
    versions: list[VersionInfo]

    @model_validator(mode="after")
    def _default_known(self) -> VersionTable:
        if self.default not in {v.id for v in self.versions}:
            raise ValueError(f"default version {self.default!r} is not listed")
        return self

    def get(self, version: str) -> VersionInfo | None:
        return next((v for v in self.versions if v.id == version), None)

    @property
    def ids(self) -> list[str]:
        return [v.id for v in self.versions]
