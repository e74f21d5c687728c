"""A model's steps data (`registry/data/steps/<model>.yaml`) turned into commands, stages and job text.

The data says what a user of MindSpeed-MM runs and which README section says it; this module fills in the
paths of one reader (the pipeline's `ckpt/hf_path/...` layout of the READMEs, or a rendered job's own
folders) and builds each step's command: a download as `huggingface-cli download`, a conversion through
the `mm-convert` argv builder (`pipeline.convert_command`, so the argument shapes live in one place), a
command from the MindSpeed-MM root as its argv. Edits, manual and unsupported steps have no command: they
become lines a user reads. The same views feed `build_pipeline`'s stages (weights .. export), the commands
`render_job` lists before training, the job README and the skills.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.errors import MMAgentError
from mm_agent.jobspec import ResolvedJob, task_repo
from mm_agent.pipeline import Layers, PipelineStage, convert_command, converter_gap, converter_notes
from mm_agent.registry.schema import STAGES, ModelEntry, SizeSpec, Stage, TaskSpec
from mm_agent.registry.steps import Step, readme_of, steps_for

_ENV_VAR = re.compile(r"^\$[A-Z_][A-Z0-9_]*$")
_NAME = re.compile(r"\{([a-z_]+)\}")
# Stages a rendered job's next steps cover before training (the job's own scripts do the rest).
BEFORE_TRAINING: tuple[Stage, ...] = ("weights", "data_prep", "feature_extraction")


def sh(argv: list[str]) -> str:
    """`shlex.join`, except bare `$VAR` words stay unquoted so the shell still expands them."""
    return " ".join(a if _ENV_VAR.match(a) else shlex.quote(a) for a in argv)


@dataclass(frozen=True)
class StepContext:
    """One reader's paths and layout: the pipeline's (README layout) or a rendered job's."""

    entry: ModelEntry
    task: TaskSpec
    size: SizeSpec
    version: str
    paths: dict[str, str]
    hf_id: str | None
    tp: int | None = None
    pp_layers: Layers | None = None
    vit_pp_layers: Layers | None = None
    have_weights: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def fill(self, text: str) -> str:
        values = {
            **self.paths,
            "hf_id": self.hf_id or "<hf_repo>",
            "size": self.size.id,
            "task": self.task.id,
            "adapts": self.task.weights_of or self.task.id,  # a LoRA: the task whose model it adapts
        }
        values.update(self._layout())
        return _NAME.sub(lambda m: values.get(m.group(1), m.group(0)), text)

    def _layout(self) -> dict[str, str]:
        """The training layout as a converter's flat lists: the job's, else the size's stock one."""
        par = self.size.parallel

        def flat(values: Layers | list[int] | None, total: object) -> str:
            if not values and isinstance(total, int):
                values = [total]
            ints = [v for v in values or [] if isinstance(v, int)] or [
                i for v in values or [] if isinstance(v, list) for i in v
            ]
            return "[" + ",".join(str(i) for i in ints) + "]"

        return {
            "tp": str(self.tp or par.tp),
            "llm_pp_layers": flat(self.pp_layers or par.llm_pp_layers, self.size.arch.get("llm_layers")),
            "vit_pp_layers": flat(self.vit_pp_layers or par.vit_pp_layers, self.size.arch.get("vit_layers")),
        }


class StepView(BaseModel):
    """One step as a reader sees it: its commands with this reader's paths, and where upstream says it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    stage: Stage
    kind: str
    title: str
    commands: list[str] = Field(
        default_factory=list, description="shell lines, run from the MindSpeed-MM root"
    )
    notes: list[str] = Field(default_factory=list)
    source: str = Field(description="README § heading, or why no README says it")
    quote: str | None = None
    cited: bool
    unsupported: bool = False
    in_job: str | None = Field(default=None, description="what in a rendered job does this step")


def source_of(entry: ModelEntry, step: Step) -> str:
    if step.cite is None:
        return f"not in a README: {step.uncited}"
    return f"{readme_of(entry, step.cite)} § {step.cite.heading}"


def _download(step: Step, ctx: StepContext) -> list[str]:
    d = step.download
    assert d is not None
    if d.url is not None:
        return ["curl", "-fL", "--create-dirs", "-o", ctx.fill(d.to), d.url]
    if d.hub == "modelscope":
        return ["modelscope", "download", "--model", ctx.fill(d.repo or ""), "--local_dir", ctx.fill(d.to)]
    argv = ["huggingface-cli", "download", ctx.fill(d.repo or "")]
    if d.repo_type != "model":
        argv += ["--repo-type", d.repo_type]
    for pattern in d.files:
        argv += ["--include", ctx.fill(pattern)]
    return [*argv, "--local-dir", ctx.fill(d.to)]


def _convert(step: Step, ctx: StepContext) -> list[str]:
    c = step.convert
    assert c is not None
    if c.layout == "job":
        tp, pp, vit = ctx.tp, ctx.pp_layers, ctx.vit_pp_layers
    else:
        tp, pp, vit = c.layout.tp, c.layout.pp_layers or [], None
    return convert_command(
        ctx.entry,
        ctx.size,
        ctx.version,
        source=ctx.fill(c.source),
        target=ctx.fill(c.target),
        hf_dir=ctx.fill(c.hf_dir) if c.hf_dir else None,
        tp=tp,
        pp_layers=pp,  # type: ignore[arg-type]  # nested (VPP) lists pass through to the argv builder
        vit_pp_layers=vit,  # type: ignore[arg-type]
        method=c.method,
        init_args={k: ctx.fill(v) for k, v in c.init_args.items()} if c.init_args is not None else None,
        task=ctx.task.id,  # the converter's extra_args for this task (e.g. a LoRA base conversion)
    )


def _dataset_notes(ctx: StepContext) -> list[str]:
    """What the job's dataset reader reads (mm_agent/dataset/formats.py) and how mm-agent writes it."""
    from mm_agent.dataset.formats import reader_format  # (data only; no I/O beyond its YAML)

    try:
        fmt = reader_format(ctx.entry.id, ctx.task.id, ctx.version, ctx.task.backend)
    except MMAgentError:
        return []
    if not fmt.supported:
        return [fmt.describe()]
    cmd = ["mm-agent", "dataset", ctx.paths["dataset"], "--model", ctx.entry.id, "--task", ctx.task.id]
    cmd += ["--mm-version", ctx.version]
    return [f"{fmt.describe()}; `{sh(cmd)}` checks a folder of clips and writes it (a dry run until --yes)"]


def view(step: Step, ctx: StepContext) -> StepView:
    """The step with this reader's paths; a conversion the release cannot run becomes a note, not a command."""
    commands: list[str] = []
    notes: list[str] = []
    if step.download is not None:
        commands.append(sh(_download(step, ctx)))
        if step.download.files:
            notes.append(f"only {', '.join(step.download.files)} of {ctx.fill(step.download.repo or '')}")
    elif step.convert is not None:
        try:
            commands.append(sh(_convert(step, ctx)))
        except MMAgentError as exc:
            notes.append(f"no mm-convert step: {exc.message}; {exc.fix}")
        if ctx.entry.converter is not None:
            notes += converter_notes(ctx.entry.converter)
    elif step.run is not None:
        command = sh([ctx.fill(w) for w in step.run])
        commands.append(f"{sh(['cd', ctx.fill(step.cwd)])} && {command}" if step.cwd else command)
    elif step.edit is not None:
        notes += [f"set {ctx.fill(e)}" for e in step.edit]
    elif step.manual is not None:
        notes.append(ctx.fill(step.manual))
        if step.stage == "data_prep" and step.id.startswith("dataset"):
            notes += _dataset_notes(ctx)
    elif step.unsupported is not None:
        notes.append(f"unsupported: {step.unsupported.reason}; fix: {step.unsupported.fix}")
    if step.differs is not None:
        notes.append(f"differs from the README: {step.differs}")
    notes += [ctx.fill(n) for n in step.notes]
    return StepView(
        id=step.id,
        stage=step.stage,
        kind=step.kind,
        title=ctx.fill(step.title),
        commands=commands,
        notes=notes,
        source=source_of(ctx.entry, step),
        quote=step.cite.quote if step.cite else None,
        cited=step.cite is not None,
        unsupported=step.unsupported is not None,
        in_job=step.in_job,
    )


def views(ctx: StepContext) -> list[StepView]:
    return [view(s, ctx) for s in steps_for(ctx.entry, ctx.task, ctx.size, ctx.version)]


# ------------------------------------------------------------------------------------------------ pipeline
def readme_paths(entry: ModelEntry, task: TaskSpec, size: SizeSpec) -> tuple[dict[str, str], str | None]:
    """The folders the MindSpeed-MM READMEs use: downloads under ckpt/hf_path/, conversions beside them.

    A diffusers-layout DiT converts in place (`<download>/transformer`, as the Wan README); other converters
    write `ckpt/<format>_path/<repo name>`; a model without a converter trains from the download."""
    repo = task_repo(size.hf_ids, task.weights_of or task.id)
    base = repo.rsplit("/", 1)[-1] if repo else f"{entry.id}-{size.id}"
    weights = f"ckpt/hf_path/{base}"
    conv = entry.converter
    if conv is None:
        load = weights
    elif entry.family == "generative" and "diffusers" in base.lower():
        load = f"{weights}/transformer"
    else:
        load = f"ckpt/{conv.target_format}_path/{base}"
    paths = {
        "weights": weights,
        "load": load,
        "save": "save_dir",
        "dataset": "dataset",
        "features": "features",
        "src": "..",
    }
    return paths, repo


def pipeline_context(entry: ModelEntry, task: TaskSpec, size: SizeSpec, version: str) -> StepContext:
    paths, repo = readme_paths(entry, task, size)
    return StepContext(entry=entry, task=task, size=size, version=version, paths=paths, hf_id=repo)


_EMPTY: dict[Stage, str] = {
    "weights": "No weights step recorded for this task",
    "data_prep": "No dataset step recorded for this task",
    "feature_extraction": "No offline feature extraction: inputs are encoded during training",
    "training": "No training step recorded for this task",
    "inference": "No inference step for this task",
    "export": "No export step for this task",
}


def _no_export(entry: ModelEntry, version: str) -> str:
    """Why a task has no export step: the converter's own gap (absent, stub) or the README's silence."""
    conv = entry.converter
    if conv is None:
        return "No export step: training saves Hugging Face-format weights, or the README describes none"
    if conv.to_hf is None:
        return f"No export step: {conv.class_name} has no method back to Hugging Face format"
    gap = converter_gap(conv, conv.to_hf, version)
    if gap is not None:
        return f"No export step: {gap.message}; {gap.fix}"
    return f"No export step in the README for this task ({conv.class_name}.{conv.to_hf} exists)"


def stage(
    name: Stage, items: list[StepView], extra_notes: list[str] | None = None, empty: str | None = None
) -> PipelineStage:
    """One pipeline stage from its steps: commands in order, each step's notes, every step's source."""
    mine = [v for v in items if v.stage == name]
    if not mine:
        return PipelineStage(
            stage=name, applies=False, summary=empty or _EMPTY[name], notes=extra_notes or []
        )
    notes: list[str] = []
    for v in mine:
        notes += [f"{v.title}: {n}" if len(mine) > 1 else n for n in v.notes]
    return PipelineStage(
        stage=name,
        applies=any(not v.unsupported for v in mine),
        summary="; ".join(v.title for v in mine),
        commands=[c for v in mine for c in v.commands],
        scripts=sorted(
            {w for v in mine for c in v.commands for w in shlex.split(c) if w.startswith("examples/")}
        ),
        notes=notes + (extra_notes or []),
        sources=list(dict.fromkeys(v.source for v in mine)),
    )


def pipeline_stages(
    entry: ModelEntry, task: TaskSpec, size: SizeSpec, version: str, nproc: int, nodes: int
) -> list[PipelineStage]:
    """Stages weights .. export of `build_pipeline`, from the model's steps data."""
    items = views(pipeline_context(entry, task, size, version))
    training_notes = [
        f"Layout asked for: NPUS_PER_NODE={nproc}, NNODES={nodes} (set them in the launch script)."
    ]
    training_notes += task.notes
    if not task.entry_script.versions.contains(version):
        training_notes.append(
            f"{task.entry_script.path} ships in {task.entry_script.versions.describe()}, not in {version}."
        )
    if nodes > 1:
        training_notes.append(
            "Run the command on every node with NODE_RANK set and MASTER_ADDR = node 0's address."
        )
    return [
        stage(
            name,
            items,
            training_notes if name == "training" else None,
            _no_export(entry, version) if name == "export" else None,
        )
        for name in STAGES
        if name not in ("env_setup", "model_deps")
    ]


# ------------------------------------------------------------------------------------------------ a rendered job
def job_context(job: ResolvedJob) -> StepContext:
    vlm = job.llm_pp_layers is not None
    return StepContext(
        entry=job.entry,
        task=job.task,
        size=job.size,
        version=job.version.id,
        paths={
            "weights": job.weights_dir,
            "load": job.load_path,
            "save": job.save_path,
            "dataset": job.dataset_dir,
            "features": job.feature_dir,
            "src": str(Path(job.mm_root).parent),
        },
        hf_id=job.hf_id,
        tp=job.tp,
        pp_layers=job.llm_pp_layers if vlm else (job.pipeline_num_layers if job.pp > 1 else []),
        vit_pp_layers=job.vit_pp_layers,
        have_weights=job.weights is not None and job.weights.transformer_config is not None,
    )


def job_views(job: ResolvedJob) -> list[StepView]:
    return views(job_context(job))


def before_training(job: ResolvedJob) -> list[str]:
    """The lines `render_job` lists before `mm-agent validate`: every step up to feature extraction that the
    rendered job does not do itself, with the job's paths; commands run in the MindSpeed-MM root."""
    ctx = job_context(job)
    lines: list[str] = []
    for step in steps_for(ctx.entry, ctx.task, ctx.size, ctx.version):
        if step.stage not in BEFORE_TRAINING or step.in_job is not None:
            continue
        if (
            ctx.have_weights
            and step.download is not None
            and step.download.to == "{weights}"
            and step.download.repo == "{hf_id}"
        ):
            continue  # the job was rendered from this download
        v = view(step, ctx)
        if not v.commands:
            lines += [f"# {v.title}: {n}" for n in v.notes] or [f"# {v.title}"]
            continue
        if step.convert is not None and ctx.entry.converter is not None:
            lines += [
                f"# {note}" for note in converter_notes(ctx.entry.converter)
            ]  # a class mm-convert lacks
        for command in v.commands:
            # a download into the job's folders runs anywhere; anything else from the MindSpeed-MM root
            here = step.download is not None and step.download.to.startswith("{")
            lines.append(command if here else f"cd {shlex.quote(job.mm_root)} && {command}")
    return lines
