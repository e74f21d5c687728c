"""What a rendered job is made of: the user's inputs (`JobSpec`, saved as job.yaml) and the values derived
from them and the registry (`ResolvedJob`) that the Jinja templates read.

Keeping the derivation here, not in templates, means every template sees the same world size, DP and GBS,
and a bad combination is refused once, with the field and the fix, before anything is written.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mm_agent.dataset.formats import default_index
from mm_agent.errors import MMAgentError
from mm_agent.fields import Name, PathText
from mm_agent.paths import inside, resolve, where
from mm_agent.registry import Registry, get_registry
from mm_agent.registry.schema import (
    Backend,
    ModelEntry,
    SizeSpec,
    TaskId,
    TaskSpec,
    TrainDefaults,
    VersionInfo,
    version_key,
)
from mm_agent.vlm_weights import qwen_vl_arch
from mm_agent.wan_weights import WanWeights, read_wan_weights

Runtime = Literal["mindspeed-mm", "bundled"]
Device = Literal["auto", "npu", "cuda", "cpu"]
Launcher = Literal["pdsh", "ascendjob", "volcano", "slurm"]
# The file each launcher is rendered to (mm_agent/launchers.py); the router names it too.
LAUNCHER_FILES: dict[Launcher, str] = {
    "pdsh": "launch_all.sh",
    "ascendjob": "ascendjob.yaml",
    "volcano": "volcano_job.yaml",
    "slurm": "slurm.sbatch",
}
BUNDLED_TEMPLATE = "bundled_generative"
BUNDLED_VLM_TEMPLATE = "bundled_vlm"
DEFAULT_SEED = 1234  # Megatron's --seed default, so an unseeded bundled job matches MindSpeed-MM's
# What a job trains with when neither the request, the size's arch.task_defaults nor the task's registry
# train_defaults (the stock launcher's values) set the field; the bundled runtime's own defaults.
GENERIC_TRAIN_DEFAULTS = TrainDefaults(train_iters=5000, lr=1e-5, num_workers=8, save_interval=10000)
TRAIN_FIELDS = ("train_iters", "lr", "num_workers", "save_interval")
# Spatial multiple the frame size must have before the VAE stride and patch size are known (8 x 2).
_MIN_HW_MULTIPLE = 16


class JobSpec(BaseModel):
    """Inputs of `render_job`; written to job.yaml so the job can be re-rendered."""

    model_config = ConfigDict(extra="forbid")

    model: Name = Field(description="registry id, e.g. wan2.1, qwen2.5vl")
    task: TaskId = Field(description="what to train (see list_models)")
    adapts: Name | None = Field(default=None, description="lora of: t2v (default), i2v (wan2.1 14b)")
    backend: Backend | None = Field(default=None, description="default: the model's first for the task")
    size: Name | None = Field(default=None, description="e.g. 1.3b, 14b (default: first)")
    mm_version: Name | None = Field(default=None, description="default: the registry's")
    mm_root: PathText = Field(default="MindSpeed-MM", description="MindSpeed-MM checkout the scripts cd into")
    weights_dir: PathText | None = Field(default=None, description="downloaded HF weights directory")
    load_path: PathText | None = Field(default=None, description="converted checkpoint dir (LOAD_PATH)")
    dataset_dir: PathText = Field(default="dataset", description="raw dataset root")
    dataset_file: PathText | None = Field(default=None, description="dataset index (data.json / MLLM json)")
    save_path: PathText | None = Field(default=None, description="default: <job dir>/checkpoints")
    feature_dir: PathText | None = Field(
        default=None, description="feature-extraction output (sora_features)"
    )
    eval_dataset: PathText | None = Field(default=None, description="evaluate.sh's benchmark TSV")
    npus_per_node: int | None = Field(default=None, ge=1, le=16)
    nnodes: int | None = Field(default=None, ge=1, le=1024)
    node_rank: int = Field(default=0, ge=0, le=1023)
    master_addr: str = Field(default="localhost", max_length=253, pattern=r"^[A-Za-z0-9_.:-]+$")
    master_port: int = Field(default=6000, ge=1024, le=65535)
    tp: int | None = Field(default=None, ge=1, le=1024)
    pp: int | None = Field(default=None, ge=1, le=1024)
    vpp: int | None = Field(default=None, ge=1, le=1024)
    cp: int | None = Field(default=None, ge=1, le=1024)
    mbs: int | None = Field(default=None, ge=1, le=1_000_000)
    gbs: int | None = Field(default=None, ge=1, le=100_000_000)
    grad_acc: int | None = Field(default=None, ge=1, le=1_000_000)
    pipeline_num_layers: list[Annotated[int, Field(ge=0, le=100_000)]] | None = Field(
        default=None, max_length=1024, description="layers per PP stage"
    )
    train_iters: int | None = Field(default=None, ge=1, le=1_000_000_000, description="training iterations")
    lr: float | None = Field(default=None, gt=0, le=10, allow_inf_nan=False, description="learning rate")
    recompute: bool = True
    num_workers: int | None = Field(default=None, ge=0, le=64, description="DataLoader workers per rank")
    save_interval: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="iterations between checkpoints",
    )
    runtime: Runtime = Field(
        default="mindspeed-mm",
        description="or bundled: mm-agent's runtime (Wan, any device)",
    )
    num_frames: int | None = Field(
        default=None, ge=1, le=10_001, description="frames per clip, 4n+1 (Wan default 81)"
    )
    max_height: int | None = Field(
        default=None, ge=16, le=16_384, description="frame height, multiple of 16 (480)"
    )
    max_width: int | None = Field(
        default=None, ge=16, le=16_384, description="frame width, multiple of 16 (832)"
    )
    text_len: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="tokens per caption",
    )
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="random seed (default 1234)")
    device: Device | None = Field(
        default=None, description="bundled runtime: auto = NPU, else CUDA, else CPU"
    )
    launcher: Launcher | None = None

    @field_validator("num_frames")
    @classmethod
    def _four_n_plus_one(cls, value: int | None) -> int | None:
        if value is not None and (value - 1) % 4:
            low = (value - 1) // 4 * 4 + 1
            raise ValueError(
                f"must be 4n+1 (the Wan VAE packs 4 frames per latent after the first); "
                f"got {value}, use {low} or {low + 4}"
            )
        return value

    @field_validator("max_height", "max_width")
    @classmethod
    def _multiple_of_16(cls, value: int | None) -> int | None:
        if value is not None and value % _MIN_HW_MULTIPLE:
            low = value // _MIN_HW_MULTIPLE * _MIN_HW_MULTIPLE
            raise ValueError(
                f"must be a multiple of {_MIN_HW_MULTIPLE} (VAE stride 8 x patch 2); got {value}, "
                f"use {max(low, _MIN_HW_MULTIPLE)} or {low + _MIN_HW_MULTIPLE}"
            )
        return value


class ResolvedJob(BaseModel):
    """Everything a template needs, with paths made absolute and parallel sizes reconciled."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: JobSpec
    entry: ModelEntry
    task: TaskSpec
    size: SizeSpec
    version: VersionInfo
    job_dir: str
    mm_root: str
    weights_dir: str
    load_path: str
    dataset_dir: str
    dataset_file: str
    save_path: str
    feature_dir: str
    eval_dataset: str | None = Field(
        default=None, description="the benchmark TSV evaluate.sh scores (tasks with an `evaluation` only)"
    )
    eval_benchmark: str | None = Field(
        default=None, description="its evaluation_dataset name, e.g. ai2d_test"
    )
    npus_per_node: int
    nnodes: int
    world_size: int
    tp: int
    pp: int
    vpp: int
    cp: int
    dp: int
    mbs: int
    grad_acc: int
    gbs: int
    pipeline_num_layers: list[int] | None
    llm_pp_layers: list[int] | None
    vit_pp_layers: list[int] | None
    arch: dict[str, Any]
    uses_features: bool
    hf_id: str | None
    runtime: Runtime
    template: str = Field(description="template set under templates/ this job renders from")
    weights: WanWeights | None = Field(description="what the Wan checkpoint's configs say (Wan family only)")
    weights_sized: bool = Field(
        default=False, description="a bundled VLM job's arch was read from the weights' config.json"
    )
    num_frames: int | None = Field(description="explicit override; templates fall back to the stock value")
    max_height: int | None
    max_width: int | None
    text_len: int | None = Field(description="from the spec or the tokenizer; None = the stock value")
    seed: int
    device: Device | None
    train_iters: int = Field(description="the request's, else the stock example's (registry), else generic")
    lr: float
    num_workers: int
    save_interval: int
    python: str = Field(description="interpreter bundled scripts default to (the one that rendered)")

    def version_at_least(self, version: str) -> bool:
        """Whether the job's MindSpeed-MM version is `version` or later (templates: stock changes by version)."""
        return version_key(self.version.id) >= version_key(version)


def _abs(base: Path, value: str) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else resolve(base / path, "path"))


# ResolvedJob paths -> the JobSpec field they come from (what a refusal names).
JOB_PATHS = {
    "mm_root": "mm_root",
    "weights_dir": "weights_dir",
    "load_path": "load_path",
    "dataset_dir": "dataset_dir",
    "dataset_file": "dataset_file",
    "save_path": "save_path",
    "feature_dir": "feature_dir",
    "eval_dataset": "eval_dataset",
}


def confine_job(job: ResolvedJob, root: Path) -> None:
    """Every path a job's scripts read or write must lie in the workspace or an allowed root (symlinks
    followed): otherwise extraction and training would read and write outside it."""
    for attr, field in JOB_PATHS.items():
        if getattr(job, attr) is None:
            continue  # a path the job does not have (eval_dataset of a task without evaluation)
        value = Path(getattr(job, attr))
        if not inside(value, root):
            raise MMAgentError(
                f"{field} {value} lies outside {where(root)}",
                field=field,
                fix="put it inside the workspace (e.g. a relative path) and re-render the job; the server "
                "operator can allow another root with `mm-agent serve --allow-path DIR`",
            )


def _eval_dataset(
    spec: JobSpec, task: TaskSpec, base: Path, bundled_vlm: bool
) -> tuple[str | None, str | None]:
    """The benchmark TSV evaluate.sh scores and its evaluation_dataset name, told by the file's name as the
    README's download link names it (AI2D_TEST.tsv -> ai2d_test); default: the stock config's benchmark in the
    dataset folder. A job without an evaluation takes no benchmark. -> (eval_dataset, eval_benchmark)"""
    evaluation = task.evaluation
    if spec.runtime == "bundled" and bundled_vlm:  # held-out questions scored by exact match, no benchmark
        return (_abs(base, spec.eval_dataset) if spec.eval_dataset else None), None
    if evaluation is None:
        if spec.eval_dataset is not None:
            raise MMAgentError(
                f"this {spec.model} {task.id} job has no evaluation stage, so eval_dataset is not used",
                field="eval_dataset",
                fix="drop eval_dataset",
            )
        return None, None
    path = _abs(base, spec.eval_dataset or str(Path(spec.dataset_dir) / evaluation.benchmarks[0].file))
    name = Path(path).name.lower()
    found = next((b for b in evaluation.benchmarks if b.file.lower() == name), None)
    if found is None:
        files = ", ".join(f"{b.file} ({b.url})" for b in evaluation.benchmarks)
        raise MMAgentError(
            f"eval_dataset {Path(path).name!r} is none of the benchmarks MindSpeed-MM's {evaluation.script.path} "
            "scores for this model; the file's name tells which one it is",
            field="eval_dataset",
            fix=f"download one of {files} and pass it under that name",
        )
    return path, found.id


def split_layers(total: int, stages: int) -> list[int]:
    """Even split with the remainder on the middle stages, the shape of the stock [7,8,8,7]."""
    base, extra = divmod(total, stages)
    counts = [base] * stages
    order = sorted(range(stages), key=lambda i: abs(i - (stages - 1) / 2))
    for i in order[:extra]:
        counts[i] += 1
    return counts


def _pick_task(entry: ModelEntry, spec: JobSpec, version: str) -> TaskSpec:
    matches = [
        t for t in entry.tasks if t.id == spec.task and (spec.backend is None or t.backend == spec.backend)
    ]
    if not matches:
        have = sorted({f"{t.id} ({t.backend})" for t in entry.tasks})
        raise MMAgentError(
            f"{entry.id} has no task {spec.task!r}" + (f" on backend {spec.backend}" if spec.backend else ""),
            field="task",
            fix=f"use one of: {', '.join(have)}",
        )
    if spec.size:
        sized = [t for t in matches if t.sizes is None or spec.size.lower() in t.sizes]
        matches = sized or matches
    in_version = [t for t in matches if t.versions.contains(version)]
    return (in_version or matches)[0]


def _adapt(entry: ModelEntry, task: TaskSpec, spec: JobSpec) -> TaskSpec:
    """The task as the job that adapts `spec.adapts`' model (Wan2.1 14B's i2v LoRA): that model's weights,
    configs and stock script. Without `adapts`, the registry's `weights_of` (the first stock example)."""
    if spec.adapts is None:
        return task
    found = task.adapting(spec.adapts)
    size = spec.size.lower() if spec.size else None
    if found is not None and (size is None or found.sizes is None or size in found.sizes):
        return found
    options = [task, *(t for t in map(task.adapting, task.adapted()[1:]) if t is not None)]
    have = [
        f"adapts={t.weights_of} ({'size ' + ', '.join(t.sizes) if t.sizes else 'every size'})"
        for t in options
        if t.weights_of
    ]
    at = f" at size {size}" if size else ""
    raise MMAgentError(
        f"no stock {entry.id} {task.id} example adapts the {spec.adapts} model{at}",
        field="adapts",
        fix=f"use {' or '.join(have)}" if have else f"leave adapts out: {task.id} adapts no other model",
    )


def _pick_size(entry: ModelEntry, task: TaskSpec, spec: JobSpec) -> SizeSpec:
    allowed = [s for s in entry.sizes if task.sizes is None or s.id in task.sizes]
    if spec.size is None:
        return allowed[0]
    size = entry.size(spec.size)
    if size is None:  # a parameter count ("5b") where the size ids are versions (CogVideoX 1.0, 1.5)
        counted = [s for s in allowed if s.params == spec.size.lower()]
        if len(counted) == 1:
            return counted[0]
        if counted:
            raise MMAgentError(
                f"{entry.id} {task.id}: size {spec.size!r} is each of {', '.join(s.id for s in counted)}",
                field="size",
                fix=f"name the one to train: {' or '.join(s.id for s in counted)} (sizes are {entry.name} versions)",
            )
    if size is None or size not in allowed:
        raise MMAgentError(
            f"{entry.id} {task.id} has no size {spec.size!r}",
            field="size",
            fix=f"use one of: {', '.join(s.id for s in allowed)}",
        )
    return size


def is_wan_family(entry: ModelEntry) -> bool:
    """Wan-family models are the ones converted by WanConverter: their predictor is MindSpeed-MM's wandit."""
    return entry.converter is not None and entry.converter.class_name == "WanConverter"


def is_two_expert(entry: ModelEntry, size: SizeSpec) -> bool:
    """Wan2.2 A14B: high- and low-noise experts trained as two jobs (the fsdp2 generative templates' rule)."""
    return is_wan_family(entry) and (size.id.lower() == "a14b" or int(size.arch.get("experts", 1)) > 1)


def _tp_choices(size: SizeSpec, world: int, pp: int, cp: int) -> str:
    """The fix for a TP*PP*CP that does not divide the world size: the TP values that work with this PP and
    CP, which also divide every attention-head count of the size (each TP rank needs whole heads)."""
    heads = {k: v for k, v in size.arch.items() if k.endswith("heads") and isinstance(v, int) and v > 0}
    ok = [
        t for t in range(1, world + 1) if not world % (t * pp * cp) and not any(h % t for h in heads.values())
    ]
    if not ok:
        return f"PP*CP = {pp}*{cp} does not divide the world size {world}: change PP, CP or the NPU count"
    shown = ", ".join(f"{k}={v}" for k, v in heads.items())
    on_heads = f" and of the heads ({shown})" if heads else ""
    return f"use TP in {ok} (divisors of {world // (pp * cp)} = world size / (PP*CP){on_heads})"


def is_bundled_vlm(entry: ModelEntry) -> bool:
    """Qwen2.5-VL: the VLM the bundled runtime fine-tunes (transformers' class, MindSpeed-MM's checkpoints)."""
    return entry.converter is not None and entry.converter.class_name == "Qwen2_5_VLConverter"


def bundled_refusal(entry: ModelEntry, task: TaskSpec, size: SizeSpec) -> str | None:
    """Why the bundled runtime cannot run this (model, task, size); None when it can."""
    if is_bundled_vlm(entry) and task.id in ("sft", "lora"):
        return None
    # a scaffolded DiT (mm-agent new-model): runtime.user_train
    if entry.user is not None and task.id == "t2v":
        return None
    adapts_t2v = task.id == "lora" and task.weights_of == "t2v"  # a LoRA of the text-to-video DiT
    if not is_wan_family(entry) or not (task.id == "t2v" or adapts_t2v):
        return (
            f"the bundled runtime trains Wan-family text-to-video (wan2.1, wan2.2 t2v, and its LoRA) and "
            f"Qwen2.5-VL fine-tuning (sft, lora); {entry.id} {task.id} is not one of them"
        )
    if is_two_expert(entry, size):
        return f"{entry.id} {size.id} is two experts (high/low noise) trained as separate MindSpeed-MM jobs"
    return None


def _check_bundled(entry: ModelEntry, task: TaskSpec, size: SizeSpec, par: dict[str, int]) -> None:
    why = bundled_refusal(entry, task, size)
    if why is not None:
        raise MMAgentError(
            why,
            field="runtime",
            fix="use --runtime mindspeed-mm (MindSpeed-MM's own scripts)"
            + (", or --size 5b for the bundled runtime" if is_two_expert(entry, size) else ""),
        )
    split = {name: n for name, n in par.items() if n > 1}
    if split:
        shown = ", ".join(f"{k.upper()}={v}" for k, v in split.items())
        raise MMAgentError(
            f"the bundled runtime trains data-parallel (FSDP2); {shown} is not supported",
            field="/".join(split),
            fix="set TP=PP=CP=VPP=1 (checkpoints converted with a PP split are merged when loaded)",
        )


_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")


def _check_arch_flags(entry: ModelEntry, size: SizeSpec) -> None:
    """`arch.stock_train_flags` (task -> switches the stock script adds) reach a launch script: each must be
    a bare `--switch`, so a data edit can never put shell text into a job."""
    flags = size.arch.get("stock_train_flags", {})
    where_ = f"sizes[{size.id}].arch.stock_train_flags"
    if not isinstance(flags, dict):
        raise MMAgentError(
            "must map a task to a list of flags",
            file=f"models/{entry.id}.yaml",
            field=where_,
            fix="write e.g. {t2v: [--use-fused-rmsnorm]}",
        )
    for task_id, values in flags.items():
        bad = (
            [v for v in values if not isinstance(v, str) or not _FLAG.match(v)]
            if isinstance(values, list)
            else [values]
        )
        if bad:
            raise MMAgentError(
                f"{bad[0]!r} is not a bare --switch",
                file=f"models/{entry.id}.yaml",
                field=f"{where_}.{task_id}",
                fix="list only switches such as --use-fused-rmsnorm (values go in parallel/arch fields)",
            )


def _task_defaults(entry: ModelEntry, size: SizeSpec, task: TaskSpec, spec: JobSpec) -> JobSpec:
    """`arch.task_defaults.<task>`: the stock example's values for one task of this size where they differ
    from the size's (e.g. Wan2.2 A14B LoRA: lr 1e-4 on 8 NPUs, full training 1e-5 on 16), applied to the
    JobSpec fields the request left at their defaults."""
    raw = size.arch.get("task_defaults", {}).get(task.id)
    if not raw:
        return spec
    field = f"sizes[{size.id}].arch.task_defaults.{task.id}"
    unknown = sorted(set(raw) - set(JobSpec.model_fields))
    if unknown:
        raise MMAgentError(
            f"{unknown[0]!r} is not a render field",
            file=f"models/{entry.id}.yaml",
            field=field,
            fix=f"use JobSpec fields: {', '.join(sorted(JobSpec.model_fields))}",
        )
    # A field still at JobSpec's own default counts as unset (None for the stock-valued fields): a spec read
    # back from job.yaml or built by a caller may set a field to its default explicitly.
    update = {k: v for k, v in raw.items() if getattr(spec, k) == JobSpec.model_fields[k].default}
    if not update:
        return spec
    try:
        return JobSpec.model_validate({**spec.model_dump(exclude_unset=True), **update})
    except ValidationError as exc:
        raise MMAgentError(
            str(exc.errors()[0]["msg"]), file=f"models/{entry.id}.yaml", field=field, fix="correct the value"
        ) from exc


def task_repo(hf_ids: list[str], task_id: str) -> str | None:
    """The size's HF repo for this task: the one whose name has the task as a word (Wan2.1-I2V-14B-480P,
    HunyuanVideo-I2V for i2v), else one with a word ending in it (stepvideo-ti2v for i2v), else the first."""

    def words(repo: str) -> list[str]:
        return re.split(r"[-_.]", repo.rsplit("/", 1)[-1].lower())

    task = task_id.lower()
    exact = [h for h in hf_ids if task in words(h)]
    near = [h for h in hf_ids if any(w.endswith(task) for w in words(h))]
    return (exact or near or hf_ids)[0] if hf_ids else None


def train_values(spec: JobSpec, task: TaskSpec, version: str) -> dict[str, Any]:
    """train_iters / lr / num_workers / save_interval of a job: the request's (a size's arch.task_defaults are
    already applied to it), else the task's stock values at `version` (registry `train_defaults` and
    `train_defaults_changes`; MindSpeed-MM jobs only),
    else GENERIC_TRAIN_DEFAULTS (also what the bundled runtime trains with)."""
    stock = task.train_defaults_at(version) if spec.runtime == "mindspeed-mm" else TrainDefaults()
    out: dict[str, Any] = {}
    for name in TRAIN_FIELDS:
        value = getattr(spec, name)
        if value is None:
            value = getattr(stock, name)
        out[name] = value if value is not None else getattr(GENERIC_TRAIN_DEFAULTS, name)
    return out


def _layers_for(
    spec: JobSpec, num_layers: int | None, pp: int, default: list[int] | None
) -> list[int] | None:
    """pipeline_num_layers that agrees with num_layers and PP: the spec's (checked), the registry's when it
    still fits (e.g. the stock [7,8,8,7] at PP=1), else an even split."""
    if spec.pipeline_num_layers is not None:
        given = spec.pipeline_num_layers
        if num_layers and sum(given) != num_layers:
            raise MMAgentError(
                f"pipeline_num_layers {given} sums to {sum(given)} but the predictor has {num_layers} layers",
                field="pipeline_num_layers",
                fix=f"use e.g. {split_layers(num_layers, pp)}",
            )
        if pp > 1 and len(given) != pp:
            raise MMAgentError(
                f"pipeline_num_layers {given} has {len(given)} stages but PP is {pp}",
                field="pipeline_num_layers",
                fix=f"give one entry per stage, e.g. {split_layers(num_layers, pp) if num_layers else '...'}",
            )
        return given
    if not num_layers:
        return default
    fits = default is not None and sum(default) == num_layers and (pp == 1 or len(default) == pp)
    if fits or (default is None and pp == 1):
        return default
    return split_layers(num_layers, pp)


def _wan_arch(
    entry: ModelEntry,
    size: SizeSpec,
    spec: JobSpec,
    weights_dir: str,
    root: Path | None,
    hf_id: str | None = None,
    size_arch: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], WanWeights | None]:
    """The size's arch (`size_arch`: at the job's version and task, SizeSpec.arch_at), overlaid with what the
    checkpoint's config.json files say (Wan family only; with `root`, only when weights_dir is inside the
    workspace)."""
    arch = dict(size.arch if size_arch is None else size_arch)
    if not is_wan_family(entry) and entry.user is None:  # a scaffolded DiT reads clips like Wan
        overrides = [f for f in ("num_frames", "max_height", "max_width", "text_len") if getattr(spec, f)]
        if overrides:
            raise MMAgentError(
                f"{', '.join(overrides)} only apply to Wan-family video jobs, not {entry.id}",
                field=overrides[0],
                fix=f"drop {', '.join('--' + f.replace('_', '-') for f in overrides)}",
            )
        return arch, None
    readable = root is None or inside(Path(weights_dir), root)
    weights = read_wan_weights(Path(weights_dir), root, hf_id) if readable else WanWeights()
    if entry.user is None:  # a scaffolded DiT is sized by its own model.json, not the base's transformer
        arch.update(weights.arch)
    text_len = spec.text_len or weights.text_len
    if text_len is not None:
        arch["text_len"] = text_len
    patch = arch.get("patch_size") or [1, 2, 2]
    for name, value, step in (
        ("max_height", spec.max_height, patch[1]),
        ("max_width", spec.max_width, patch[2]),
    ):
        stride = weights.spatial_stride * int(step)
        if value is not None and value % stride:
            raise MMAgentError(
                f"{name} {value} is not a multiple of {stride} (VAE stride {weights.spatial_stride} x patch "
                f"{step}), so the latent grid would not tile into patches",
                field=name,
                fix=f"use {max(stride, value // stride * stride)} or {value // stride * stride + stride}",
            )
    if spec.num_frames is not None and (spec.num_frames - 1) % weights.temporal_stride:
        raise MMAgentError(
            f"num_frames {spec.num_frames} is not {weights.temporal_stride}n+1 for this VAE",
            field="num_frames",
            fix=f"use {(spec.num_frames - 1) // weights.temporal_stride * weights.temporal_stride + 1}",
        )
    return arch, weights


def resolve_job(
    spec: JobSpec,
    job_dir: Path,
    *,
    base: Path | None = None,
    registry: Registry | None = None,
    root: Path | None = None,
) -> ResolvedJob:
    """Check the spec against the registry and derive every value the templates use.

    `root` (the MCP workspace) confines what is read: the checkpoint's config.json files are only read
    when weights_dir is inside it.
    """
    reg = registry or get_registry()
    base = (base or Path.cwd()).resolve()
    entry = reg.get(spec.model)
    # a scaffolded model defaults to the release its files were written for
    default = entry.user.mm_version if entry.user is not None else reg.versions.default
    version_id = reg.check_version(spec.mm_version or default)
    if not entry.versions.contains(version_id):
        have = [v for v in reg.versions.ids if entry.versions.contains(v)]
        raise MMAgentError(
            f"{entry.id} is not in MindSpeed-MM {version_id} (it exists in {entry.versions.describe()})",
            field="mm_version",
            fix=f"use --mm-version {have[-1]}" if have else "pick another model",
        )
    task = _adapt(entry, _pick_task(entry, spec, version_id), spec)
    entry = entry.for_task(task)  # a task converted by its own converter (registry `tasks[].converter`)
    size = _pick_size(entry, task, spec)
    _check_arch_flags(entry, size)
    spec = _task_defaults(entry, size, task, spec)
    version = reg.versions.get(version_id)
    assert version is not None  # check_version guarantees it
    # this version's stock layout (the size's registry `changes` for this version and task)
    par = size.parallel_at(version_id, task.id, task.backend)

    npus, nnodes = spec.npus_per_node or par.npus_per_node, spec.nnodes or par.nnodes
    tp, pp, cp = spec.tp or par.tp, spec.pp or par.pp, spec.cp or par.cp
    vpp, mbs = spec.vpp or par.vpp, spec.mbs or par.mbs
    if spec.runtime == "bundled":
        # the bundled runtime trains data-parallel: a stock model-parallel layout becomes DP unless asked for
        tp, pp, cp, vpp = spec.tp or 1, spec.pp or 1, spec.cp or 1, spec.vpp or 1
        _check_bundled(entry, task, size, {"tp": tp, "pp": pp, "cp": cp, "vpp": vpp})
    elif spec.device not in (None, "auto", "npu"):
        raise MMAgentError(
            f"MindSpeed-MM runs on Ascend NPUs; device {spec.device!r} needs the bundled runtime",
            field="device",
            fix="drop --device"
            if bundled_refusal(entry, task, size)
            else "drop --device, or add --runtime bundled (mm-agent's runtime: Wan-family t2v, Qwen2.5-VL)",
        )
    world = npus * nnodes
    if world % (tp * pp * cp):
        raise MMAgentError(
            f"world size {world} (npus_per_node {npus} x nnodes {nnodes}) is not divisible by "
            f"TP*PP*CP = {tp}*{pp}*{cp}",
            field="tp/pp/cp",
            fix=_tp_choices(size, world, pp, cp),
        )
    dp = world // (tp * pp * cp)
    if spec.gbs is not None:
        if spec.gbs % (mbs * dp):
            raise MMAgentError(
                f"global batch size {spec.gbs} is not divisible by MBS*DP = {mbs}*{dp}",
                field="gbs",
                fix=f"use a multiple of {mbs * dp}, or set grad_acc instead",
            )
        grad_acc = spec.gbs // (mbs * dp)
    else:
        grad_acc = spec.grad_acc or par.grad_acc
    gbs = mbs * dp * grad_acc

    jd = job_dir.resolve()
    hf_id = task_repo(size.hf_ids, task.weights_of or task.id)
    weights = _abs(base, spec.weights_dir or f"weights/{hf_id or entry.id}")
    size_arch = size.arch_at(version_id, task.id, task.backend)
    arch, wan = _wan_arch(entry, size, spec, weights, root, hf_id, size_arch)
    sized = False
    if spec.runtime == "bundled" and is_bundled_vlm(entry) and (root is None or inside(Path(weights), root)):
        # the bundled runtime trains what weights_dir holds; model.json must describe that network
        found = qwen_vl_arch(Path(weights), root)
        sized = bool(found)
        overrides = {**arch.get("model_json", {}), **found.pop("model_json", {})}
        arch.update(found)
        if overrides:
            arch["model_json"] = overrides

    num_layers = arch.get("num_layers")
    pnl = _layers_for(spec, int(num_layers) if num_layers else None, pp, par.pipeline_num_layers)
    llm = par.llm_pp_layers
    vit = par.vit_pp_layers
    llm_total, vit_total = arch.get("llm_layers"), arch.get("vit_layers")
    if llm_total and vit_total is not None and (pp != par.pp or pp == 1):
        # ViT layers all go to the first stage (MindSpeed-MM requires ViT before LLM layers).
        llm = split_layers(int(llm_total), pp)
        vit = [int(vit_total)] + [0] * (pp - 1)

    uses_features = task.feature_extraction is not None
    default_load = weights
    if entry.converter is not None and entry.family != "generative":
        default_load = f"{weights}-mm" if entry.converter.target_format == "mm" else f"{weights}-dcp"
    if entry.converter is not None and entry.family == "generative":
        # MindSpeed-MM converts in place (release/ next to the safetensors). The bundled runtime gets its
        # own folder, so the HF download stays untouched and a job validates before conversion.
        default_load = f"{weights}-mm" if spec.runtime == "bundled" else str(Path(weights) / "transformer")
    dit_subdir = size.arch.get("dit_subdir", {}).get(task.id)
    if entry.converter is None and isinstance(dit_subdir, str):
        # No conversion: LOAD_PATH is the DiT folder inside the HF download (HunyuanVideo-1.5 transformer/720p_t2v).
        default_load = str(Path(weights) / dit_subdir)
    eval_dataset, eval_benchmark = _eval_dataset(spec, task, base, is_bundled_vlm(entry))
    job = ResolvedJob(
        spec=spec,
        entry=entry,
        task=task,
        size=size,
        version=version,
        job_dir=str(jd),
        mm_root=_abs(base, spec.mm_root),
        weights_dir=weights,
        load_path=_abs(base, spec.load_path) if spec.load_path else default_load,
        dataset_dir=_abs(base, spec.dataset_dir),
        # the index this model's reader reads (data.jsonl for CogVideoX/StepVideo, data.json for the rest)
        dataset_file=_abs(base, spec.dataset_file)
        if spec.dataset_file
        else str(
            Path(_abs(base, spec.dataset_dir)) / default_index(entry.id, task.id, version_id, task.backend)
        ),
        save_path=_abs(base, spec.save_path) if spec.save_path else str(jd / "checkpoints"),
        feature_dir=_abs(base, spec.feature_dir) if spec.feature_dir else str(jd / "sora_features"),
        eval_dataset=eval_dataset,
        eval_benchmark=eval_benchmark,
        npus_per_node=npus,
        nnodes=nnodes,
        world_size=world,
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        dp=dp,
        mbs=mbs,
        grad_acc=grad_acc,
        gbs=gbs,
        pipeline_num_layers=pnl,
        llm_pp_layers=llm,
        vit_pp_layers=vit,
        arch=arch,
        uses_features=uses_features,
        hf_id=hf_id,
        runtime=spec.runtime,
        template=(BUNDLED_VLM_TEMPLATE if is_bundled_vlm(entry) else BUNDLED_TEMPLATE)
        if spec.runtime == "bundled"
        else task.template,
        weights=wan,
        weights_sized=sized,
        num_frames=spec.num_frames,
        max_height=spec.max_height,
        max_width=spec.max_width,
        text_len=spec.text_len or (wan.text_len if wan is not None else None),
        seed=spec.seed if spec.seed is not None else DEFAULT_SEED,
        device=spec.device,
        **train_values(spec, task, version.id),
        python=sys.executable,
    )
    if root is not None:
        confine_job(job, root)
    return job


# Rendered script -> the job-management stage that runs it (C6); names are MindSpeed-MM's.
