"""What a training job will load: how many of its model's parameters the checkpoint it names would fill.

MindSpeed-MM loads several models non-strictly: a Megatron generative job's predictor (SoRAModel), an FSDP2-native
job's DCP checkpoint (training.load_strict defaults to False) and every LoRA run. A checkpoint converted for
another layout, another task or another trainer then loads partly or not at all, and the rest of the model
trains from its random initialisation without an error. These checks count, without torch and without running
any pickle (`mm_agent.ckptkeys`), the parameters a checkpoint would fill against the names the job's model
requests (`registry/data/load_keys.yaml`, checked against MindSpeed-MM's own model classes by
tests/fidelity/test_load_keys.py), and say "N of M parameters would load; the rest start random" when N < M.

`validate_configs` (rules_load.py) runs them on a job's files, `render_job` on the files it renders when the
checkpoint is already on this machine; both also carry the notes a job needs whatever its checkpoint (the
StepVideo stock depth).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.ckptkeys import (
    CheckpointUnreadable,
    Shapes,
    dcp_tensors,
    rank_file_tensors,
    safetensors_tensors,
)
from mm_agent.errors import MMAgentError
from mm_agent.paths import read_file
from mm_agent.registry import DATA_DIR, load_data
from mm_agent.registry.schema import version_key

LOAD_KEYS_FILE = DATA_DIR / "load_keys.yaml"
TRACKER = "latest_checkpointed_iteration.txt"
_SHOWN = 5  # names listed in a message


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Flag(_Frozen):
    """A yes/no read from the job's model config: its value is one of `in`, or (truthy) it is set and true."""

    key: str
    in_: list[str] | None = Field(default=None, alias="in")
    truthy: bool = False

    @model_validator(mode="after")
    def _one(self) -> Flag:
        if (self.in_ is None) == (not self.truthy):
            raise ValueError("a flag gives exactly one of `in` and `truthy: true`")
        return self

    def value(self, config: dict[str, Any]) -> bool:
        found = dotted(config, self.key)
        return bool(found) if self.truthy else found in (self.in_ or [])


class Group(_Frozen):
    names: list[str] = Field(min_length=1)
    each: str | None = Field(default=None, description="a count: the names repeat per index, under `prefix`")
    prefix: str = Field(default="", description="with `each`: the indexed prefix, `{i}` the index")
    when: str | list[str] | None = Field(default=None, description="flags that must all hold")

    @model_validator(mode="after")
    def _indexed(self) -> Group:
        if (self.each is None) != ("{i}" not in self.prefix):
            raise ValueError("a group with `each` has a prefix holding {i}, and only such a group")
        return self

    @property
    def conditions(self) -> list[str]:
        return [self.when] if isinstance(self.when, str) else list(self.when or [])


class PredictorKeys(_Frozen):
    source: str = Field(min_length=10)
    applies: Flag | None = None
    counts: dict[str, str] = Field(description="count name -> model config key holding it")
    flags: dict[str, Flag] = Field(default_factory=dict)
    groups: list[Group] = Field(min_length=1)

    @model_validator(mode="after")
    def _known(self) -> PredictorKeys:
        for group in self.groups:
            if group.each is not None and group.each not in self.counts:
                raise ValueError(f"group counts {group.each!r}, not one of {sorted(self.counts)}")
            for name in group.conditions:
                if name not in self.flags:
                    raise ValueError(f"group needs flag {name!r}, not one of {sorted(self.flags)}")
        return self

    def names(self, config: dict[str, Any]) -> list[str] | None:
        """The parameter names of the predictor this config builds; None when the list does not cover it."""
        if self.applies is not None and not self.applies.value(config):
            return None
        counts: dict[str, int] = {}
        for name, key in self.counts.items():
            value = dotted(config, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return None
            counts[name] = value
        flags = {name: flag.value(config) for name, flag in self.flags.items()}
        out: list[str] = []
        for group in self.groups:
            if not all(flags[c] for c in group.conditions):
                continue
            if group.each is None:
                out += group.names
            else:
                out += [
                    group.prefix.replace("{i}", str(i)) + n
                    for i in range(counts[group.each])
                    for n in group.names
                ]
        return out

    @property
    def block_prefix(self) -> re.Pattern[str] | None:
        """The indexed prefix (`blocks.{i}.`) as a pattern capturing the index, to renumber pipeline stages."""
        prefixes = {g.prefix for g in self.groups if g.each is not None}
        if len(prefixes) != 1:
            return None
        head, tail = prefixes.pop().split("{i}")
        return re.compile("^" + re.escape(head) + r"(\d+)" + re.escape(tail))


class NativeKeys(_Frozen):
    source: str = Field(min_length=10)
    prefix: str = ""
    converter: str = Field(min_length=5, description="the conversion whose output keeps these names")
    tied: dict[str, str] = Field(
        default_factory=dict,
        description="with tie_word_embeddings in config.json: parameter -> the checkpoint tensor it shares, "
        "which the Hugging Face checkpoint stores once",
    )
    retied_since: str | None = Field(
        default=None,
        description="the first MindSpeed-MM version whose trainer ties the head to the embedding again after "
        "allocating the meta model, so a tied name the checkpoint lacks is filled through its partner; before it, "
        "allocation unties them and the tied name must be in the checkpoint",
    )

    def expected(
        self, hf_dir: Path, version: str | None, root: Path | None = None
    ) -> dict[str, tuple[int, ...]]:
        """The names and shapes the model requests at `version`: the checkpoint's at `hf_dir`, prefixed, and the
        tied copies where that version needs them in the checkpoint (an unknown version: not)."""
        names = safetensors_tensors(hf_dir, root)
        retied = version is None or (
            self.retied_since is not None and version_key(version) >= version_key(self.retied_since)
        )
        if self.tied and not retied and _ties(hf_dir, root):
            for target, source in self.tied.items():
                if source in names:
                    names.setdefault(target, names[source])
        return {self.prefix + name: shape for name, shape in names.items()}


def _ties(hf_dir: Path, root: Path | None) -> bool:
    """Whether config.json ties the output head to the input embedding (top level, its text_config, or an omni
    model's thinker_config.text_config)."""
    try:
        config = json.loads(read_file(hf_dir / "config.json", root, "config.json", limit=4_000_000))
    except (MMAgentError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    thinker = config.get("thinker_config")
    texts = [
        config,
        config.get("text_config"),
        thinker.get("text_config") if isinstance(thinker, dict) else None,
    ]
    return any(isinstance(t, dict) and t.get("tie_word_embeddings") for t in texts)


class Depth(_Frozen):
    model: str = Field(description="the registry model whose stock configs these are")
    released: int = Field(ge=1)
    source: str = Field(min_length=10)
    stock_configs: list[str] = Field(min_length=1)
    released_configs: list[str] = Field(min_length=1)


class LoadKeys(_Frozen):
    predictors: dict[str, PredictorKeys]
    native: dict[str, NativeKeys]
    depth: dict[str, Depth] = Field(default_factory=dict)
    not_run: dict[str, str] = Field(
        default_factory=dict,
        description="registry model id -> why tests/fidelity/load_fidelity.py cannot run its conversion and "
        "model on a CPU machine (the report's 'parameters loaded' cell says so)",
    )


def load_load_keys(path: Path) -> LoadKeys:
    return load_data(LoadKeys, path, schema="mm_agent/loadcheck.py")


@functools.cache
def load_keys() -> LoadKeys:
    return load_load_keys(LOAD_KEYS_FILE)


def dotted(data: Any, key: str) -> Any:
    node = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


# ---------------------------------------------------------------------------------------------- findings
@dataclass
class Issue:
    """One thing to say about what the training will load."""

    severity: Literal["error", "warning", "info"]
    rule: str
    message: str
    fix: str
    field: str | None = None
    loaded: int | None = None
    total: int | None = None


@dataclass
class Count:
    """`loaded` of `total` names the model requests are in the checkpoint with the same shape."""

    total: int
    loaded: int
    missing: list[str] = field(default_factory=list)
    other_shape: list[str] = field(default_factory=list)

    def text(self) -> str:
        out = f"{self.loaded:,} of {self.total:,} parameters would load"
        if self.loaded < self.total:
            out += "; the rest start random"
            if self.missing:
                out += f" (not in the checkpoint: {_shown(self.missing)})"
            if self.other_shape:
                out += f" (other shape in the checkpoint: {_shown(self.other_shape)})"
        return out


def _shown(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" and {more:,} more" if more > 0 else "")


def count(wanted: dict[str, tuple[int, ...] | None], have: Shapes) -> Count:
    """How many wanted names the checkpoint holds (with the same shape, where the wanted shape is known)."""
    missing = [n for n in wanted if n not in have]
    other = [n for n, s in wanted.items() if n in have and s is not None and tuple(have[n]) != tuple(s)]
    return Count(
        total=len(wanted), loaded=len(wanted) - len(missing) - len(other), missing=missing, other_shape=other
    )


# ---------------------------------------------------------------------------------------------- checkpoints
def iteration_dir(load_dir: Path, root: Path | None = None) -> Path | None:
    """The folder the tracker names (`release/` or `iter_XXXXXXX/`), None when there is no usable tracker."""
    tracker = load_dir / TRACKER
    try:
        text = read_file(tracker, root, "tracker", limit=4096).decode("utf-8", errors="replace").strip()
    except MMAgentError:
        return None
    if text == "release":
        folder = load_dir / "release"
    elif text.isdigit():
        folder = load_dir / f"iter_{int(text):07d}"
    else:
        return None
    return folder if folder.is_dir() else None


def megatron_tensors(
    iter_dir: Path, pp_layers: list[int] | None, block: re.Pattern[str] | None, root: Path | None = None
) -> Shapes | None:
    """The model tensors of a Megatron checkpoint iteration as one state dict: TP rank 0 of each pipeline stage,
    stage-local block numbers turned global by `pp_layers` (None: not one plain TP/PP layout it can read)."""
    stages = len(pp_layers) if pp_layers else 1
    out: Shapes = {}
    offset = 0
    for stage in range(stages):
        rank = "mp_rank_00" if stages == 1 else f"mp_rank_00_{stage:03d}"
        path = iter_dir / rank / "model_optim_rng.pt"
        if not os.path.lexists(path):
            return None  # a missing stage: rules_ckpt's rank-dir check says so
        models = rank_file_tensors(path, root)
        if set(models) != {"model"}:
            return None  # virtual pipeline chunks: left to the manifest and rank-dir checks
        for name, shape in models["model"].items():
            match = block.match(name) if block is not None and stages > 1 else None
            if match is not None:
                name = name[: match.start(1)] + str(offset + int(match.group(1))) + name[match.end(1) :]
            out[name] = shape
        offset += pp_layers[stage] if pp_layers else 0
    return out


# ---------------------------------------------------------------------------------------------- the checks
def predictor_check(model_config: dict[str, Any], load_dir: Path, root: Path | None = None) -> Issue | None:
    """A Megatron generative job (pretrain_sora.py): the converted checkpoint in `load_dir` against the names its
    predictor requests. None when the model is not listed, or the checkpoint cannot be read as one plain layout."""
    model_id = dotted(model_config, "predictor.model_id")
    spec = load_keys().predictors.get(model_id) if isinstance(model_id, str) else None
    if spec is None:
        return None
    names = spec.names(model_config)
    iter_dir = iteration_dir(load_dir, root)
    if names is None or iter_dir is None:
        return None
    layers = dotted(model_config, "predictor.pipeline_num_layers")
    flat = layers if isinstance(layers, list) and all(isinstance(n, int) for n in layers) else None
    try:
        have = megatron_tensors(iter_dir, flat if flat and len(flat) > 1 else None, spec.block_prefix, root)
    except CheckpointUnreadable as exc:
        return Issue("warning", "load.unreadable", f"{exc}; the parameters it holds were not counted",
                     "re-convert the checkpoint, or check the file with torch.load")  # fmt: skip
    if have is None:
        return None
    result = count(dict.fromkeys(names), have)
    if result.loaded == result.total:
        return Issue("info", "load.complete", f"{load_dir}: {result.text()}", "nothing to do",
                     loaded=result.loaded, total=result.total)  # fmt: skip
    return Issue(
        "error",
        "load.partial",
        f"{load_dir}: {result.text()}: MindSpeed-MM loads the predictor non-strictly "
        "(SoRAModel.load_state_dict) and only logs the missing names",
        "convert the weights of this task and size (the model config's predictor must match the checkpoint: "
        "model_type, num_layers) into LOAD_PATH, or point LOAD_PATH at the checkpoint converted for it",
        field="--load",
        loaded=result.loaded,
        total=result.total,
    )


def native_check(
    config: dict[str, Any], load_dir: Path, hf_dir: Path | None, version: str | None, root: Path | None = None
) -> Issue | None:
    """An FSDP2-native job of MindSpeed-MM `version`: the DCP checkpoint in `load_dir` against its model's names (the
    Hugging Face checkpoint's at `hf_dir`, under the model's prefix). None when the model is not listed or a side is
    not here."""
    model_id = dotted(config, "model.model_id")
    spec = load_keys().native.get(model_id) if isinstance(model_id, str) else None
    iter_dir = iteration_dir(load_dir, root)
    if spec is None or iter_dir is None or hf_dir is None or not hf_dir.is_dir():
        return None
    try:
        have = dcp_tensors(iter_dir, root)
        wanted = spec.expected(hf_dir, version, root)
    except CheckpointUnreadable as exc:
        return Issue("warning", "load.unreadable", f"{exc}; the parameters it holds were not counted",
                     "re-convert the checkpoint, or check its files")  # fmt: skip
    result = count(dict(wanted), have)
    if result.loaded == result.total:
        return Issue("info", "load.complete", f"{load_dir}: {result.text()}", "nothing to do",
                     loaded=result.loaded, total=result.total)  # fmt: skip
    strict = dotted(config, "training.load_strict") is True
    how = (
        "training.load_strict is set, so the load fails"
        if strict
        else "the DCP load is non-strict (training.load_strict defaults to False), so nothing fails"
    )
    return Issue(
        "error",
        "load.partial",
        f"{load_dir}: {result.text()}; {how}. The fsdp2-native {model_id} keeps the Hugging Face names and "
        f"shapes ({spec.source})",
        f"convert with {spec.converter} into training.load, from model.model_name_or_path's weights",
        field="training.load",
        loaded=result.loaded,
        total=result.total,
    )


def meta_init_check(config: dict[str, Any]) -> Issue | None:
    """An FSDP2-native job that builds its model on the meta device and loads nothing: every weight is
    initialised at random (mindspeed_mm/fsdp/train/trainer.py:162-167, `init_model_weights`)."""
    training = config.get("training") if isinstance(config, dict) else None
    if not isinstance(training, dict) or training.get("init_model_with_meta_device") is not True:
        return None
    if training.get("load"):
        return None
    # a warning, not an error: some stock examples do exactly this (Kimi-K2.5's README copies only the config
    # files into model_name_or_path), which trains from scratch, right for a throughput run only
    return Issue(
        "warning",
        "load.meta_init_random",
        "training.init_model_with_meta_device is true and training.load is unset: MindSpeed-MM builds the model "
        "on the meta device and, with nothing to load, initialises every weight at random (trainer.py "
        "init_model_weights); model.model_name_or_path is read for the config only",
        "convert the Hugging Face weights to DCP and set training.load to that folder (the model's README), or "
        "set training.init_model_with_meta_device: false to load model.model_name_or_path directly",
        field="training.load",
    )


# load_checkpoint's own test of the path it is given (mindspeed_mm/models/common/checkpoint.py:36-41 at 26.0.0)
_CHECKPOINT_SUFFIXES = ("pt", "pth", ".safetensors")


def pretrained_file_check(model_config: dict[str, Any]) -> Issue | None:
    """A predictor that loads its converted weights itself (`predictor.from_pretrained`, VACE: its stock script passes
    no --load) from a path load_checkpoint refuses: it takes one .pt/.pth/.safetensors file and raises for anything
    else (FileNotFoundError for a folder), so the job stops while building its model."""
    value = dotted(model_config, "predictor.from_pretrained")
    if not isinstance(value, str) or not value or value.endswith(_CHECKPOINT_SUFFIXES):
        return None
    rank_file = value.rstrip("/") + "/release/mp_rank_00/model_optim_rng.pt"
    return Issue(
        "error",
        "load.pretrained_not_a_file",
        f"predictor.from_pretrained {value!r} is not a checkpoint file: PredictModel loads it with load_checkpoint, "
        "which takes one .pt/.pth/.safetensors file and raises for a folder (FileNotFoundError) before training "
        "starts (mindspeed_mm/models/common/checkpoint.py:32-41, models/predictor/predict_model.py:52-56 at "
        "26.0.0 and 26.1.0; the stock VACE configs' folder value fails the same way)",
        f"point it at the rank file the conversion wrote, e.g. {rank_file} (VACEConverter hf_to_mm at TP 1, PP 1; "
        "an iter_XXXXXXX folder when the tracker names one)",
        field="predictor.from_pretrained",
    )


def depth_check(model_config: dict[str, Any]) -> Issue | None:
    """A predictor built shallower than the released checkpoint it loads (StepVideo's stock pretrain config)."""
    model_id = dotted(model_config, "predictor.model_id")
    spec = load_keys().depth.get(model_id) if isinstance(model_id, str) else None
    layers = dotted(model_config, "predictor.num_layers")
    if spec is None or not isinstance(layers, int) or layers >= spec.released:
        return None
    return Issue(
        "warning",
        "load.partial_depth",
        f"predictor.num_layers {layers}: the model is built with {layers} of the released {spec.released} layers, "
        f"and the converted checkpoint loads non-strictly, so layers {layers}-{spec.released - 1} are dropped "
        f"without a word and the fine-tuned model is a {layers}-layer one ({spec.source})",
        f"keep {layers} only if a {layers}-layer model is what you mean to train (MindSpeed-MM's stock pretrain "
        f"config does); set predictor.num_layers to {spec.released} to fine-tune the whole released model",
        field="predictor.num_layers",
    )
