"""Each model's steps as data: what a user runs, in order, and the README section that says so.

One file per model, `registry/data/steps/<model>.yaml` (`model` = the file stem), lists the steps a user of
MindSpeed-MM runs for every task, size and version of that model: downloads (repo ids and the files each
step needs), conversions (converter method, source, target, layout), dataset preparation, feature
extraction, training, inference, evaluation and export. Every step cites the README section it comes from
(file, heading and a short quote that `tests/fidelity/test_step_citations.py` re-finds at every version the
step claims); a step no README describes says why (`uncited`), and a step MindSpeed-MM cannot do at that
version is `unsupported`, with the fix a user can follow.

The steps are data only. `mm_agent/pipeline.py` turns them into the pipeline's stages and the commands of
`render_job`'s next steps (downloads as `huggingface-cli download`, conversions through the `mm-convert` argv
builder), the job README lists them, and the skills are generated from them.

Paths inside a step are templates over a few names the reader fills in: `{weights}` (the task's Hugging
Face download), `{load}` (the training LOAD_PATH), `{save}` (the training save folder), `{dataset}` (the
dataset folder), `{features}` (the feature folder), `{src}` (the folder that holds the MindSpeed-MM checkout,
where READMEs clone diffusers and other sources beside it), `{size}` and `{task}` (the size and task ids, as the
examples/ folders name them), `{adapts}` (a LoRA's adapted task: its `weights_of`, or the one a job picks),
`{tp}`, `{llm_pp_layers}` and `{vit_pp_layers}` (the training layout, for a
converter call with method-specific arguments) and, in `download.repo`, `{hf_id}` (the task's Hugging Face
repo from the model's sizes). A `<...>` word is a value only the user knows (a prompt file, a TP size
the README leaves open); it is shown as it is.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import get_registry, read_yaml, validation_error
from mm_agent.registry.schema import Backend, ModelEntry, SizeSpec, Stage, TaskId, TaskSpec, VersionRange
from mm_agent.registry.tokens import HttpsUrl

STEPS_DIR = Path(__file__).with_name("data") / "steps"
SCHEMA = "mm_agent/registry/steps.py"
PATH_NAMES = (
    "weights",
    "load",
    "save",
    "dataset",
    "features",
    "src",
    "size",
    "task",
    "adapts",
    "tp",
    "llm_pp_layers",
    "vit_pp_layers",
)
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# A path template: plain path characters, `{name}` placeholders and `<user value>` words; no shell syntax.
_PATH = re.compile(r"^[A-Za-z0-9_.{}<>/*+=:,@-]+$")
# An argv word: path characters plus spaces inside a `<user value>`; still no quotes, `$` or `;`.
_WORD = re.compile(r"^[A-Za-z0-9_.{}<>/*+=:,@ !\[\]-]+$")
_REPO = re.compile(r"^(\{hf_id\}|[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)$")
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def _placeholders(value: str, allowed: tuple[str, ...]) -> str:
    for name in _PLACEHOLDER.findall(value):
        if name not in allowed:
            raise ValueError(f"{value!r}: unknown placeholder {{{name}}}; known: {', '.join(allowed)}")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r}: no '..' in a step path")
    return value


def _path(value: str) -> str:
    if not _PATH.match(value):
        raise ValueError(f"{value!r} is not a path template (letters, digits, _ . / - * and {{name}})")
    return _placeholders(value, PATH_NAMES)


def _word(value: str) -> str:
    if not _WORD.match(value) or value.startswith(" ") or value.endswith(" "):
        raise ValueError(f"{value!r} is not a plain argv word (no quotes, $, ; or surrounding spaces)")
    return _placeholders(value, PATH_NAMES)


def _repo(value: str) -> str:
    if not _REPO.match(value):
        raise ValueError(f"{value!r} is not a Hugging Face repo id (owner/name) or {{hf_id}}")
    return value


PathTemplate = Annotated[str, AfterValidator(_path)]
Word = Annotated[str, AfterValidator(_word)]
RepoId = Annotated[str, AfterValidator(_repo)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Cite(_Frozen):
    """Where upstream says this step: a README (or doc) of the MindSpeed-MM tree, a heading, a quote."""

    file: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.md$",
        description="path from the MindSpeed-MM root; None = <example_dir>/README.md",
    )
    heading: str = Field(min_length=2, description="the section's heading text, without the #s")
    quote: str = Field(
        min_length=4,
        description="text the section holds (whitespace-insensitive), what the citation test re-finds",
    )


class Download(_Frozen):
    """A Hugging Face repo (or the files of it the step needs) into a folder, or one file from a URL."""

    repo: RepoId | None = None
    repo_type: Literal["model", "dataset"] = "model"
    hub: Literal["huggingface", "modelscope"] = "huggingface"
    url: HttpsUrl | None = Field(default=None, description="a single file outside Hugging Face")
    files: list[Word] = Field(default_factory=list, description="--include patterns; empty = the whole repo")
    to: PathTemplate = Field(description="the folder (repo) or file (url) it lands in")

    @model_validator(mode="after")
    def _one_source(self) -> Download:
        if (self.repo is None) == (self.url is None):
            raise ValueError("a download names exactly one of repo and url")
        if self.url is not None and self.files:
            raise ValueError("files are --include patterns of a repo download, not of a url")
        return self


class Layout(_Frozen):
    """A fixed parallel layout a conversion writes (the stock script's, when it differs from the job's)."""

    tp: int = Field(default=1, ge=1, le=64)
    pp_layers: list[int] | None = None


class Convert(_Frozen):
    """One `mm-convert` call: the argv comes from the converter argv builder (`mm_agent.pipeline`)."""

    method: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    init_args: dict[str, Word] | None = Field(
        default=None, description="the converter's --init arguments for this call; None = the model's"
    )
    source: PathTemplate
    target: PathTemplate
    hf_dir: PathTemplate | None = Field(default=None, description="the original HF folder (exports)")
    layout: Literal["job"] | Layout = Field(
        default="job",
        description="job: the training layout (the job's TP/PP, or the size's stock one); a Layout: fixed",
    )


class Unsupported(_Frozen):
    reason: str = Field(min_length=15)
    fix: str = Field(min_length=10, description="what a user can do instead")


class Step(_Frozen):
    id: str = Field(description="unique within the model's file")
    stage: Stage
    title: str = Field(min_length=8, description="what the step does and why, one line")
    tasks: list[TaskId] | None = Field(default=None, description="tasks it belongs to; None = all")
    backends: list[Backend] | None = Field(default=None, description="backends it belongs to; None = all")
    sizes: list[str] | None = Field(default=None, description="sizes it belongs to; None = all")
    versions: VersionRange | None = Field(default=None, description="None = the model's versions")
    cite: Cite | None = None
    uncited: str | None = Field(
        default=None, min_length=15, description="why no README section says this step (mm-agent's own)"
    )
    download: Download | None = None
    convert: Convert | None = None
    run: list[Word] | None = Field(default=None, description="a command run from the MindSpeed-MM root")
    cwd: PathTemplate | None = Field(
        default=None, description="the folder (from the MindSpeed-MM root) `run` starts in, when not the root"
    )
    edit: list[str] | None = Field(
        default=None, description="settings of stock files the user changes by hand (file: field -> value)"
    )
    manual: str | None = Field(default=None, min_length=10, description="a step with no command")
    unsupported: Unsupported | None = None
    differs: str | None = Field(
        default=None,
        min_length=15,
        description="where this step differs on purpose from the cited README text, and the upstream evidence why",
    )
    in_job: str | None = Field(
        default=None,
        min_length=5,
        description="a rendered job does this itself: its file or how (render_job leaves the step out)",
    )
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shape(self) -> Step:
        if not _ID.match(self.id):
            raise ValueError(f"step id {self.id!r}: lower-case letters, digits, - _ .")
        kinds = [
            k for k in ("download", "convert", "run", "edit", "manual", "unsupported") if getattr(self, k)
        ]
        if len(kinds) != 1:
            raise ValueError(
                f"step {self.id}: exactly one of download, convert, run, edit, manual, unsupported (got {kinds})"
            )
        if self.cwd is not None and self.run is None:
            raise ValueError(f"step {self.id}: cwd goes with run")
        if (self.cite is None) == (self.uncited is None):
            raise ValueError(f"step {self.id}: give a cite, or say in `uncited` why no README says it")
        return self

    @property
    def kind(self) -> str:
        return next(
            k for k in ("download", "convert", "run", "edit", "manual", "unsupported") if getattr(self, k)
        )

    def applies(self, task: TaskSpec, size: str, version: str, model_versions: VersionRange) -> bool:
        return (
            (self.tasks is None or task.id in self.tasks)
            and (self.backends is None or task.backend in self.backends)
            and (self.sizes is None or size in self.sizes)
            and (self.versions or model_versions).contains(version)
        )


class ModelSteps(_Frozen):
    model: str
    versions: VersionRange = Field(
        description="the MindSpeed-MM versions these steps describe; other versions keep the registry-derived "
        "pipeline (mm_agent/pipeline.py) until their README is read"
    )
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> ModelSteps:
        ids = [s.id for s in self.steps]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate step ids {dupes}")
        return self


def readme_of(entry: ModelEntry, cite: Cite) -> str:
    """The cited file, from the MindSpeed-MM root."""
    return cite.file or f"{entry.example_dir}/README.md"


def _check_against_registry(path: Path, table: ModelSteps) -> None:
    """Steps name tasks, sizes, versions and converter methods the model has."""
    reg = get_registry()
    entry = reg.models.get(table.model)

    def fail(index: int, field: str, message: str, fix: str) -> MMAgentError:
        return MMAgentError(message, file=str(path), field=f"steps.{index}.{field}", fix=fix)

    if entry is None:
        raise MMAgentError(
            f"no registry model {table.model!r}",
            file=str(path),
            field="model",
            fix="name the model's registry id (the file stem of registry/data/models/<id>.yaml)",
        )
    tasks = {t.id for t in entry.tasks}
    sizes = {s.id for s in entry.sizes}
    for i, step in enumerate(table.steps):
        for t in step.tasks or []:
            if t not in tasks:
                raise fail(i, "tasks", f"{entry.id} has no task {t!r}", f"use one of {sorted(tasks)}")
        for s in step.sizes or []:
            if s not in sizes:
                raise fail(i, "sizes", f"{entry.id} has no size {s!r}", f"use one of {sorted(sizes)}")
        if step.versions is not None:
            for v in (step.versions.since, step.versions.until):
                if v is not None and v != VersionRange().since and v not in reg.versions.ids:
                    raise fail(
                        i, "versions", f"unknown MindSpeed-MM version {v!r}", f"use one of {reg.versions.ids}"
                    )
        if step.convert is not None:
            conv = entry.converter
            if conv is None or step.convert.method not in conv.methods:
                have = conv.methods if conv else []
                raise fail(
                    i,
                    "convert.method",
                    f"{entry.id}'s converter has no method {step.convert.method!r}",
                    f"use one of {have} (or add the method to the model's converter.methods)",
                )


def load_steps(directory: Path | None = None) -> dict[str, ModelSteps]:
    """Every `<model>.yaml` of the steps folder, validated and checked against the registry."""
    folder = directory or STEPS_DIR
    out: dict[str, ModelSteps] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            table = ModelSteps.model_validate(read_yaml(path))
        except ValidationError as exc:
            raise validation_error(path, exc, SCHEMA) from exc
        if table.model != path.stem:
            raise MMAgentError(
                f"steps of model {table.model!r} in the file of {path.stem!r}",
                file=str(path),
                field="model",
                fix=f"set model: {path.stem}, or move the steps to steps/{table.model}.yaml",
            )
        _check_against_registry(path, table)
        out[table.model] = table
    return out


@functools.cache
def all_steps() -> dict[str, ModelSteps]:
    return load_steps()


def has_steps(entry: ModelEntry, version: str) -> bool:
    """Whether the model's steps data describes `version` (else the pipeline derives its stages)."""
    table = all_steps().get(entry.id)
    return table is not None and table.versions.contains(version) and entry.versions.contains(version)


def steps_for(entry: ModelEntry, task: TaskSpec, size: SizeSpec, version: str) -> list[Step]:
    """The steps of (model, task, size) at `version`, in file order ([] when the model has no steps file)."""
    table = all_steps().get(entry.id)
    if table is None or not table.versions.contains(version):
        return []
    return [s for s in table.steps if s.applies(task, size.id, version, entry.versions)]
