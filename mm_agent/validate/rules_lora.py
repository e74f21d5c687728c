"""LoRA rules for a MindSpeed-MM training launch with `--lora-*` flags (`lora.*`).

MindSpeed-MM turns LoRA on only when `--lora-target-modules` is non-empty
(`mindspeed_mm/tasks/finetune/lora/utils.py: is_enable_lora`), keeps only the modules PEFT's suffix match
finds (`lora_patch.py`; none found: the model trains in full, silently), loads `--load` non-strictly (a
missing base is random init, silently) and saves the adapter weights only. These rules catch what fails
late or silently: rank, alpha, target names against the model's modules, the forward hook recompute
needs, the base checkpoint against the save folder, and the stock save/load switches.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.registry import DATA_DIR, load_data
from mm_agent.validate.job import Job, Launch, is_dir, is_file, to_int
from mm_agent.validate.refs import locate

TRACKER = "latest_checkpointed_iteration.txt"

LORA_MODULES_FILE = DATA_DIR / "lora_modules.yaml"


class PredictorModules(BaseModel):
    """What PEFT can wrap in one predictor, and what the forward hook may name (registry/data/lora_modules.yaml)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(min_length=10)
    modules: tuple[str, ...] = Field(min_length=1)
    hook_names: tuple[str, ...] = ()

    @property
    def hooks(self) -> frozenset[str]:
        return frozenset(p.rsplit(".", 1)[-1] for p in self.modules) | set(self.hook_names)


class LoraModules(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    predictors: dict[str, PredictorModules]


def load_lora_modules_file(path: Path) -> LoraModules:
    return load_data(LoraModules, path, schema="mm_agent/validate/rules_lora.py")


@functools.cache
def wan_modules() -> PredictorModules:
    """The Wan DiT's entry, read when a LoRA launch is judged."""
    return load_lora_modules_file(LORA_MODULES_FILE).predictors["wandit"]


# checkpoint/sora_model/wan_converter.py `lora_target_modules` (kept as data in the converter's key map):
# merge_lora_to_base merges adapters whose key contains one of these and drops every other adapter without a word.
@functools.cache
def wan_merged_targets() -> tuple[str, ...]:
    """Read when a LoRA launch is judged, not when the validator (or the MCP server) starts."""
    from mm_agent.convert.mapping import load_mapping

    rules = load_mapping("WanConverter").lora
    assert rules is not None, "mappings/WanConverter.yaml has no lora section"
    return tuple(rules.target_modules)


STOCK_SWITCHES = ("--no-load-optim", "--no-load-rng", "--no-save-optim", "--no-save-rng")


def check(job: Job) -> None:
    for launch in job.launches:
        if (
            launch.is_training
            and not launch.is_feature
            and any(f.startswith("--lora-") for f in launch.flags)
        ):
            _check_launch(job, launch)


def _model_id(launch: Launch) -> str | None:
    model = launch.configs.get("mm-model")
    value = model.get("predictor.model_id") if model is not None else None
    return value if isinstance(value, str) else None


def _targets(launch: Launch) -> list[str]:
    """The target list as MindSpeed-MM reads it (one comma-separated word is split, as lora_patch.py does)."""
    values = [v for v in launch.flags.get("--lora-target-modules", []) if v]
    if values and "," in values[0]:
        values = [v for v in values[0].split(",") if v]
    return values


def _check_launch(job: Job, launch: Launch) -> None:
    _check_rank(job, launch)
    targets = _targets(launch)
    if not targets:
        file, _, line = launch.where("--lora-target-modules")
        job.sink.error(
            "lora.targets_missing",
            file,
            "--lora-* flags without --lora-target-modules: MindSpeed-MM enables LoRA only with target modules, "
            "so this run fine-tunes every weight and saves full checkpoints",
            "add `--lora-target-modules ffn.2 ffn.0 proj_q proj_k proj_v proj_out` (the stock Wan2.1 "
            "finetune_lora.sh targets)",
            field="--lora-target-modules",
            line=line,
        )
    elif _model_id(launch) == "wandit":
        _check_wan_targets(job, launch, targets)
    if _model_id(launch) == "wandit":
        _check_wan_hook(job, launch)
    _check_base(job, launch)
    if not launch.is_bundled:  # the bundled runtime keeps the adapter's optimizer and RNG for exact resume
        _check_switches(job, launch)


def _check_rank(job: Job, launch: Launch) -> None:
    rank = to_int(launch.value("--lora-r"))
    if launch.has("--lora-r") and (rank is None or rank < 1):
        file, _, line = launch.where("--lora-r")
        job.sink.error(
            "lora.rank",
            file,
            f"--lora-r {launch.value('--lora-r')}: the LoRA rank must be an integer of at least 1 (PEFT refuses "
            "r <= 0 and WanConverter merge_lora_to_base raises 'LoRA rank can not be 0')",
            "set --lora-r to a positive rank (stock Wan2.1: 16)",
            field="--lora-r",
            line=line,
        )
    if not launch.has("--lora-alpha"):
        file, _, line = launch.where(None)
        job.sink.warning(
            "lora.alpha_missing",
            file,
            "no --lora-alpha: MindSpeed-MM scales the adapter with its default alpha 16, and merging needs the "
            "same --lora_alpha the run trained with",
            "pass --lora-alpha explicitly (stock Wan2.1: --lora-alpha 16, equal to --lora-r)",
            field="--lora-alpha",
            line=line,
        )


def _check_wan_targets(job: Job, launch: Launch, targets: list[str]) -> None:
    file, _, line = launch.where("--lora-target-modules")
    modules = wan_modules().modules
    matched = {t: [p for p in modules if p == t or p.endswith("." + t)] for t in targets}
    unknown = [t for t in targets if not matched[t]]
    if unknown:
        names = sorted({p.split("blocks.0.", 1)[-1] for p in modules})
        job.sink.error(
            "lora.target_unknown",
            file,
            f"--lora-target-modules {' '.join(unknown)}: no such linear module in the Wan DiT; MindSpeed-MM "
            "skips targets it cannot find, and with none left it trains the whole model",
            f"use module names of the Wan DiT ({', '.join(names)}); stock: ffn.2 ffn.0 proj_q proj_k proj_v "
            "proj_out",
            field="--lora-target-modules",
            line=line,
        )
    merged = wan_merged_targets()
    dropped = [t for t in targets if any(not any(m in p for m in merged) for p in matched[t])]
    if dropped:
        job.sink.warning(
            "lora.target_not_merged",
            file,
            f"--lora-target-modules {' '.join(dropped)}: WanConverter merge_lora_to_base merges only adapters on "
            f"{', '.join(merged)}; these adapters train but are dropped when merging",
            "target only " + " ".join(merged) + " to merge every adapter into the base",
            field="--lora-target-modules",
            line=line,
        )


def _check_wan_hook(job: Job, launch: Launch) -> None:
    """With full recompute the blocks run checkpointed: their input must require grad or the adapters inside
    get no gradient. The stock scripts hook patch_embedding; MindSpeed-MM's default names are an LLM's."""
    if launch.value("--recompute-granularity") != "full":
        return
    hooks = [h for h in launch.flags.get("--lora-register-forward-hook", []) if h]
    if any(h in wan_modules().hooks for h in hooks):
        return
    file, _, line = launch.where("--lora-register-forward-hook")
    job.sink.error(
        "lora.forward_hook",
        file,
        f"--recompute-granularity full with --lora-register-forward-hook {' '.join(hooks) or '(default)'}: no "
        "Wan DiT module has that name, so the recomputed blocks see inputs without grad and the adapters "
        "inside them do not train",
        "pass `--lora-register-forward-hook patch_embedding` (the stock Wan2.1 finetune_lora.sh)",
        field="--lora-register-forward-hook",
        line=line,
    )


def _same(a: str, b: str) -> bool:
    return os.path.normpath(os.path.expanduser(a)) == os.path.normpath(os.path.expanduser(b))


def _check_base(job: Job, launch: Launch) -> None:
    load, save, base = launch.value("--load"), launch.value("--save"), launch.value("--load-base-model")
    if not load and not base:
        file, field, line = launch.where(None, "LOAD_PATH")
        job.sink.error(
            "lora.base_missing",
            file,
            "a LoRA run without --load: the base weights are random (MindSpeed-MM loads LoRA runs non-strictly "
            "and says nothing)",
            "set LOAD_PATH to the converted base weights (mm-convert WanConverter hf_to_mm) and pass "
            "`--load $LOAD_PATH`",
            field=field or "--load",
            line=line,
        )
        return
    if base and load and not launch.is_bundled:
        _check_first_run(job, launch, load, save, base)
    # with --load-base-model the base comes from there and --load resumes the adapter (it may be --save)
    flag, value = ("--load-base-model", base) if base else ("--load", load)
    if value and save and _same(value, save):
        var = "SAVE_PATH" if launch.env("SAVE_PATH") == save else None
        file, field, line = launch.where("--save", var)
        job.sink.error(
            "lora.save_is_base",
            file,
            f"--save is the base checkpoint ({flag} {value}): the adapter-only checkpoints and their "
            "latest_checkpointed_iteration.txt land in the base folder, and the next load of it finds "
            "adapter weights only",
            "point SAVE_PATH at a folder of its own (the job's checkpoints/); keep LOAD_PATH on the base",
            field=field or "--save",
            line=line,
        )


def _check_first_run(job: Job, launch: Launch, load: str, save: str | None, base: str) -> None:
    """`--load-base-model` continues an adapter: MindSpeed-MM reads it only after Megatron found a checkpoint in
    `--load` (lora_patch.py `_load_base_checkpoint_wrapper`, 26.0.0:207-219: `state_dict is not None`). Over a
    folder without a tracker Megatron's `_load_base_checkpoint` returns nothing and the run 'will start from
    random' (core_v0.12.1 checkpointing.py:924-935): the base is never loaded, the adapter trains on a random
    model and nothing fails. The stock first run passes the base as `--load` (examples/qwen2.5vl/README.md
    LoRA微调; docs/zh/features/lora_finetune.md: --load-base-model is for 续训)."""
    found = locate(job, launch, load)
    if found.why or found.path is None:
        return
    if is_file(found.path / TRACKER):
        return  # an adapter checkpoint to continue
    here = is_dir(found.path) or (save is not None and _same(load, save))
    file, _, line = launch.where("--load")
    say = job.sink.error if here else job.sink.warning
    say(
        "lora.first_run_random",
        file,
        f"--load-base-model {base} with --load {load}, which holds no checkpoint ({TRACKER} "
        + ("missing" if here else "not found on this machine")
        + "): Megatron finds nothing to load and starts from random, and MindSpeed-MM reads --load-base-model "
        "only after --load found a checkpoint, so the base is never loaded and the adapter trains on a random "
        "model without an error",
        'for a first run pass the converted base as `--load "$LOAD_PATH"` and drop --load-base-model (the '
        "stock LoRA run); keep `--load-base-model` only to continue an adapter whose --load folder holds a "
        "checkpoint",
        field="--load",
        line=line,
    )


def _check_switches(job: Job, launch: Launch) -> None:
    missing = [flag for flag in STOCK_SWITCHES if not launch.has(flag)]
    if not missing:
        return
    file, _, line = launch.where(None)
    job.sink.warning(
        "lora.save_load_switches",
        file,
        f"a LoRA run without {' '.join(missing)}: the base checkpoint holds no optimizer or RNG state for the "
        "adapter (a trained base's optimizer state does not fit it), and the stock LoRA checkpoints keep "
        "only the adapter weights",
        "pass " + " ".join(STOCK_SWITCHES) + " as the stock finetune_lora.sh does",
        field=missing[0],
        line=line,
    )
