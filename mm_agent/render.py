"""`render_job`: Jinja templates -> a complete MindSpeed-MM job directory.

Each registry task names a template set (`templates/<set>/`). Every `*.j2` file in the set renders to the
same relative path without `.j2`; a template that renders to nothing is left out (that is how optional files
such as `fsdp2_config.yaml` follow the backend). Values placed in shell scripts go through the `q` filter
(`shlex.quote`) and values placed in JSON/YAML through `tojson`, so user input never becomes code.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from jinja2 import TemplateError
from pydantic import BaseModel, Field

from mm_agent.errors import MMAgentError
from mm_agent.estimate.plan import LayoutFit, cp_rule, fit_layout
from mm_agent.estimate.schema import EstimateRequest
from mm_agent.fields import PathText
from mm_agent.jobfile import JOB_FILE, load_job_spec
from mm_agent.jobspec import JobSpec, ResolvedJob, Runtime, resolve_job
from mm_agent.jobwrite import write_job
from mm_agent.launchers import LAUNCHER_FILES, check_job_dir, launcher_steps, render_launcher
from mm_agent.paths import confine, resolve, roots_of
from mm_agent.scaffold.usercode import user_code
from mm_agent.templating import jinja_environment, templates_dir


class RenderRequest(JobSpec):
    out_dir: PathText = Field(description="job directory to create")
    confirm: bool = Field(default=False, description="write the files (false: dry run)")
    force: bool = Field(default=False, description="replace a different job (kept as a backup)")


class RenderedFile(BaseModel):
    path: str
    kind: Literal["shell", "json", "yaml", "text"]
    bytes: int
    sha256: str
    content: str | None = Field(default=None, description="file text (dry runs only)")


class RenderResult(BaseModel):
    job_dir: str
    model: str
    task: str
    adapts: str | None = Field(default=None, description="a LoRA: the task whose model it adapts")
    backend: str
    size: str
    mm_version: str
    runtime: Runtime = Field(description="what the scripts run: MindSpeed-MM, or mm-agent's bundled runtime")
    status: Literal["dry_run", "written", "unchanged", "replaced"]
    backup_dir: str | None = None
    kept_outputs: list[str] = Field(
        default_factory=list,
        description="outputs of the replaced job (features, samples) moved into this one",
    )
    files: list[RenderedFile]
    next_steps: list[str]
    fit: str | None = Field(
        default=None, description="memory verdict for the NPU count asked for (estimate_resources)"
    )
    load_check: list[str] = Field(
        default_factory=list,
        description="what the training will load (mm_agent/loadcheck.py): 'error: N of M parameters would load; "
        "the rest start random' when LOAD_PATH already holds a checkpoint that does not fit the rendered model, "
        "and what the job's model config leaves out of the released weights (warning)",
    )


def _kind(path: str) -> Literal["shell", "json", "yaml", "text"]:
    suffix = Path(path).suffix
    return {".sh": "shell", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(suffix, "text")  # type: ignore[return-value]


def _check_parses(path: str, text: str) -> None:
    """A template bug must never reach the user as a file MindSpeed-MM cannot read."""
    try:
        if path.endswith(".json"):
            json.loads(text)
        elif path.endswith((".yaml", ".yml")):
            yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise MMAgentError(
            f"template rendered invalid {Path(path).suffix}: {exc}",
            file=path,
            fix="this is an mm-agent bug; please report it with the render command",
        ) from exc


def render_files(job: ResolvedJob) -> dict[str, str]:
    """Render the task's template set (with the model's own files) for a resolved job: relative path -> text."""
    root = templates_dir()
    set_dir = root / job.template
    if not set_dir.is_dir():
        raise MMAgentError(f"no template set {job.template!r}", file=str(set_dir), fix="reinstall mm-agent")
    env = jinja_environment(str(root))
    from mm_agent.stepplan import job_views  # (it builds on pipeline's argv builder, which imports jobspec)

    context: dict[str, Any] = {
        "job": job,
        "spec": job.spec,
        "entry": job.entry,
        "task": job.task,
        "size": job.size,
        "arch": job.arch,
        "version": job.version,
        # the model's cited steps with this job's paths (the job README lists them)
        "steps": job_views(job) if job.runtime != "bundled" else [],
        # a scaffolded model (mm-agent new-model): its own files and model.json, read now
        "user": user_code(job.entry) if job.entry.user is not None else None,
    }
    # A model's own files (templates/models/<model>/<set>/): each replaces the set's file of the same path,
    # or adds one the set lacks. The set's templates see which with `model_files`.
    model_dir = root / "models" / job.entry.id / job.template
    templates = {p.relative_to(set_dir).as_posix(): p for p in set_dir.rglob("*.j2")}
    own = (
        {p.relative_to(model_dir).as_posix(): p for p in model_dir.rglob("*.j2")}
        if model_dir.is_dir()
        else {}
    )
    templates.update(own)
    context["model_files"] = {rel[: -len(".j2")] for rel in own}
    files: dict[str, str] = {}
    for rel_j2, template_path in sorted(templates.items()):
        rel = rel_j2[: -len(".j2")]
        name = template_path.relative_to(root).as_posix()
        try:
            text = env.get_template(name).render(**context)
        except TemplateError as exc:
            raise MMAgentError(
                f"template {name} failed: {exc}", file=name, fix="this is an mm-agent bug"
            ) from exc
        if not text.strip():
            continue
        _check_parses(rel, text)
        files[rel] = text
    if job.spec.launcher is not None:
        for rel, text in render_launcher(job, job.spec.launcher, _train_script(job, files)).items():
            _check_parses(rel, text)
            files[rel] = text
    files[JOB_FILE] = (
        "# Inputs of `mm-agent render`; re-render with: mm-agent render --from job.yaml\n"
        + yaml.safe_dump(
            job.spec.model_dump(mode="json", exclude_none=True), sort_keys=False, allow_unicode=True
        )
    )
    return files


def _train_script(job: ResolvedJob, files: dict[str, str]) -> str:
    """The job's training-stage script (what a launcher starts on every node)."""
    found = next((rel for rel, stage in _STAGE_OF_SCRIPT.items() if stage == "train" and rel in files), None)
    if found is None:
        raise MMAgentError(
            f"this {job.entry.id} {job.task.id} job has no training script for launcher {job.spec.launcher!r}",
            field="launcher",
            fix="render it without --launcher and start its scripts yourself",
        )
    return found


def _job_files(target: Path, root: Path | None) -> set[str] | None:
    """The files the job.yaml in `target` renders to: the job's own files, as opposed to what running the
    job wrote into its directory (features, samples). None when `target` holds no readable job."""
    if not (target / JOB_FILE).is_file():
        return None
    try:
        spec = load_job_spec(target / JOB_FILE, root)
        return set(render_files(resolve_job(spec, target, base=root, root=root)))
    except MMAgentError:
        return None


def _check_out_dir(target: Path, base: Path, root: Path | None) -> None:
    """A job directory is never the workspace (or the current directory), a parent of it, or a root the
    server allows: replacing one would move everything in it to a backup."""
    protected = {base, *(roots_of(root) if root is not None else ())}
    for place in sorted(protected):
        if target == place or place.is_relative_to(target):
            what = (
                "the workspace" if root is not None and place == root.resolve() else f"the directory {place}"
            )
            if root is None and place == base:
                what = "the current directory"
            relation = "is" if target == place else "contains"
            raise MMAgentError(
                f"out_dir {target} {relation} {what}; a job directory must be a folder of its own",
                field="out_dir",
                fix="render into a new subdirectory, e.g. jobs/<name>",
            )


def _next_steps(job: ResolvedJob, files: dict[str, str]) -> list[str]:
    """The commands that take this job from nothing to training, in order, with this job's paths."""
    from mm_agent.pipeline import bundled_convert_command, convert_command, converter_gap, converter_notes
    from mm_agent.registry.steps import has_steps
    from mm_agent.stepplan import before_training

    d = job.job_dir
    steps: list[str] = _master_addr_step(job)  # a multi-node job no node can join: first
    have_weights = job.weights is not None and job.weights.transformer_config is not None
    if job.template == "bundled_vlm":
        have_weights = job.weights_sized
    # MindSpeed-MM jobs take their downloads, conversions and data steps from the model's steps data
    # (registry/data/steps/<model>.yaml, each step citing its README section)
    cited = job.runtime != "bundled" and has_steps(job.entry, job.version.id)
    if job.hf_id and not have_weights and not cited:
        steps.append(shlex.join(["huggingface-cli", "download", job.hf_id, "--local-dir", job.weights_dir]))
    if job.runtime == "bundled":
        vlm = job.template == "bundled_vlm"  # a Qwen2.5-VL folder is the model itself, no transformer/
        source = job.weights_dir if vlm else str(Path(job.weights_dir) / "transformer")
        if job.entry.user is None:  # a scaffolded DiT trains from its own initial weights: nothing to convert
            steps.append(shlex.join(bundled_convert_command(job.entry, source=source, target=job.load_path)))
        steps.append(f"mm-agent validate {shlex.quote(d)}")
        if job.spec.launcher is not None:
            if job.uses_features:  # one node extracts for all of them, onto the shared feature_dir
                steps.append(f"{_ONE_NODE} mm-agent extract {shlex.quote(d)} --yes --wait")
            steps += launcher_steps(job, job.spec.launcher)
            if "inference.sh" in files:
                steps.append(f"mm-agent sample {shlex.quote(d)} --yes --wait")
            return steps
        if job.nnodes > 1:
            # the job manager starts one node; every node runs the same scripts with its own rank
            launch = ["feature_extract/feature_extraction.sh"] if job.uses_features else []
            steps += _per_node(job, [s for s in [*launch, "pretrain.sh"] if s in files])
            if "inference.sh" in files:
                steps.append(f"mm-agent sample {shlex.quote(d)} --yes --wait")
            return steps
        if job.uses_features:
            steps.append(f"mm-agent extract {shlex.quote(d)} --yes --wait")
        steps.append(f"mm-agent train {shlex.quote(d)} --yes --wait")
        if "inference.sh" in files:
            steps.append(f"mm-agent sample {shlex.quote(d)} --yes --wait")
        if "evaluate.sh" in files:
            steps.append(f"mm-agent evaluate {shlex.quote(d)} --yes --wait")
        if vlm:
            steps += _bundled_vlm_export(job)
        return steps
    conv = job.entry.converter
    gap = converter_gap(conv, conv.to_training, job.version.id) if conv is not None else None
    if cited:
        steps += before_training(job)
    elif gap is not None:
        steps.append(f"# no mm-convert step: {gap.message}; {gap.fix}")
    elif conv is not None:
        vlm = job.llm_pp_layers is not None
        in_place = job.load_path == str(Path(job.weights_dir) / "transformer")
        argv = convert_command(
            job.entry,
            job.size,
            job.version.id,
            source=job.load_path if in_place else job.weights_dir,
            target=job.load_path,
            tp=job.tp,
            pp_layers=job.llm_pp_layers if vlm else (job.pipeline_num_layers if job.pp > 1 else []),
            vit_pp_layers=job.vit_pp_layers,
            task=job.task.id,
        )
        steps += [f"# {note}" for note in converter_notes(conv)]
        steps.append(f"cd {shlex.quote(job.mm_root)} && {shlex.join(argv)}")
    steps.append(f"mm-agent validate {shlex.quote(d)}")
    scripts = sorted(
        p
        for p in files
        if p.endswith(".sh")
        and not p.startswith(("feature_extract/", "inference", "evaluate"))
        and p not in LAUNCHER_FILES.values()
    )
    if job.uses_features:
        scripts.insert(0, "feature_extract/feature_extraction.sh")
    if job.spec.launcher is not None:
        train = _train_script(job, files)
        # before training, on one node (features land on the shared feature_dir)
        steps += [f"{_ONE_NODE} bash {shlex.quote(d + '/' + s)}" for s in scripts if s != train]
        return steps + launcher_steps(job, job.spec.launcher) + _lora_merge(job) + _evaluate(job, files)
    if job.nnodes > 1:
        return steps + _per_node(job, scripts) + _lora_merge(job) + _evaluate(job, files)
    steps += [f"bash {shlex.quote(d + '/' + s)}" for s in scripts]
    return steps + _lora_merge(job) + _evaluate(job, files)


def _bundled_vlm_export(job: ResolvedJob) -> list[str]:
    """After training: the checkpoint back to a Hugging Face folder (a LoRA adapter merged into its base first)."""
    from mm_agent.pipeline import bundled_convert_command

    source, steps = job.save_path, []  # (its tracker names the last iteration)
    if job.task.id == "lora":
        merged = f"{job.save_path}-merged"
        merge = [job.python, "-m", "runtime.vlm_merge", "--model", job.weights_dir, "--base", job.load_path]
        steps.append(shlex.join([*merge, "--lora", job.save_path, "--out", merged]))
        source = merged
    argv = bundled_convert_command(
        job.entry, source=source, target=f"{job.save_path}-hf", method="mm_to_hf", hf_dir=job.weights_dir
    )
    return ["# after training: export to the Hugging Face layout", *steps, shlex.join(argv)]


def _evaluate(job: ResolvedJob, files: dict[str, str]) -> list[str]:
    """After training: the benchmark the job's evaluate.sh scores (the README's download link) and the run."""
    evaluation = job.task.evaluation
    if "evaluate.sh" not in files or evaluation is None or job.eval_dataset is None:
        return []
    url = next(b.url for b in evaluation.benchmarks if b.id == job.eval_benchmark)
    script = shlex.quote(job.job_dir + "/evaluate.sh")
    run = f"bash {script}"
    if job.tp * job.pp > job.npus_per_node:  # the split spans nodes: each runs it with its NODE_RANK
        run = f"NODE_RANK=<rank> MASTER_ADDR=<node-0-ip> bash {script}  # on every node of the TP x PP split"
    return [
        f"# after training: evaluate the checkpoint on {job.eval_benchmark} (README 评测; needs "
        "pip install -e '.[evaluate]' in MindSpeed-MM)",
        shlex.join(["curl", "-L", "--create-dirs", "-o", job.eval_dataset, url]),
        run,
    ]


def _lora_merge(job: ResolvedJob) -> list[str]:
    """A LoRA job's adapter merged into its base after training, where inference.sh samples from it."""
    lora = job.arch.get("lora") if job.task.id == "lora" else None
    conv = job.entry.converter
    from mm_agent.convert.plan import NATIVE  # (the plan module loads no torch)

    if not lora or conv is None or "merge_lora_to_base" not in NATIVE.get(conv.class_name, ()):
        return []  # mm-agent merges natively only where MindSpeed-MM's merge is matched byte for byte
    argv = ["mm-agent", "convert", conv.class_name, "merge_lora_to_base", "--source", job.load_path]
    argv += ["--lora", job.save_path, "--target", job.load_path + "_merge"]
    argv += ["--lora-rank", str(lora["r"]), "--lora-alpha", str(lora["alpha"]), "--yes"]
    return [
        "# after training: merge the adapter into the base (inference.sh samples the merge)",
        shlex.join(argv),
    ]


# Nodes listed one command each; above this, node 0, node 1 and one line for the rest.
_ONE_NODE = "NNODES=1 NODE_RANK=0"  # a multi-node job's script run on a single node (feature extraction)
_NODES_LISTED = 8


def _master_addr_step(job: ResolvedJob) -> list[str]:
    """A multi-node job whose master address no other node can reach: the re-render comes first."""
    from mm_agent.validate.rules_multinode import unreachable

    # a cluster launcher gives every node the master's address itself
    why = unreachable(job.spec.master_addr) if job.nnodes > 1 and job.spec.launcher is None else None
    if why is None:
        return []
    d = shlex.quote(job.job_dir)
    return [
        f"# {job.nnodes} nodes, but master_addr {why}: re-render with node 0's IP that every node can reach",
        f"mm-agent render --from {d}/job.yaml --out {d} --master-addr <node-0-ip> --force",
    ]


def _per_node(job: ResolvedJob, scripts: list[str]) -> list[str]:
    """One command per node for each launch script: same job dir on every node, its own NODE_RANK."""
    from mm_agent.validate.rules_multinode import unreachable

    addr = "<node-0-ip>" if unreachable(job.spec.master_addr) else shlex.quote(job.spec.master_addr)
    steps = [
        f"# {job.nnodes} nodes: every node needs this job dir at the same path {job.job_dir} (shared storage, "
        "or copy it with the weights and data), then runs each command below on its node, node 0 (the master) "
        "and the others together"
    ]
    ranks = list(range(job.nnodes))
    if job.nnodes > _NODES_LISTED:
        ranks = [0, 1]
    for script in scripts:
        path = shlex.quote(job.job_dir + "/" + script)
        for rank in ranks:
            where = "on node 0 (the master)" if rank == 0 else f"on node {rank}"
            steps.append(f"NODE_RANK={rank} MASTER_ADDR={addr} bash {path}  # {where}")
        if job.nnodes > _NODES_LISTED:
            steps.append(
                f"NODE_RANK=<rank> MASTER_ADDR={addr} bash {path}  # on node <rank>, 2 .. {job.nnodes - 1}"
            )
    return steps


def render_job(req: RenderRequest, *, root: Path | None = None) -> RenderResult:
    """Render a job; write it only when `req.confirm` is true. `root` confines `out_dir` (MCP workspace)."""
    base = (root or Path.cwd()).resolve()
    target = confine(req.out_dir, root, "out_dir") if root else resolve(base / req.out_dir, "out_dir")
    _check_out_dir(target, base, root)
    # exclude_unset: the spec's model_fields_set is what the request gave, not every field at its default
    spec = JobSpec.model_validate(req.model_dump(include=set(JobSpec.model_fields), exclude_unset=True))
    job = resolve_job(spec, target, base=base, root=root)
    check_job_dir(job)
    fit = _fit(job)
    if fit is not None and fit.cp != job.cp:
        job = resolve_job(spec.model_copy(update={"cp": fit.cp}), target, base=base, root=root)
    files = render_files(job)
    status: str = "dry_run"
    backup: str | None = None
    moved: list[str] = []
    if req.confirm:
        status, backup, moved = write_job(
            target, files, force=req.force, root=root, job_files_of=lambda t: _job_files(t, root)
        )
    return RenderResult(
        job_dir=str(target),
        model=job.entry.id,
        task=job.task.id,
        adapts=job.task.weights_of if job.task.id == "lora" else None,
        backend=job.task.backend,
        size=job.size.id,
        mm_version=job.version.id,
        runtime=job.runtime,
        status=status,  # type: ignore[arg-type]
        backup_dir=backup,
        kept_outputs=moved,
        files=[
            RenderedFile(
                path=rel,
                kind=_kind(rel),
                bytes=len(text.encode()),
                sha256=hashlib.sha256(text.encode()).hexdigest(),
                content=None if req.confirm else text,
            )
            for rel, text in sorted(files.items())
        ],
        next_steps=_next_steps(job, files),
        fit=fit.note if fit else None,
        load_check=_load_check(job, files, root),
    )


def _load_check(job: ResolvedJob, files: dict[str, str], root: Path | None) -> list[str]:
    """`loadcheck` over the rendered training model config: the depth note always, the parameter count when
    the job's LOAD_PATH (and, for FSDP2-native jobs, its Hugging Face folder) is on this machine (inside the
    workspace, over MCP)."""
    from mm_agent import loadcheck
    from mm_agent.paths import inside
    from mm_agent.validate.files import classify

    if job.runtime == "bundled":
        return []  # the bundled runtime loads strictly and refuses a partial checkpoint itself

    def here(path: str | None) -> Path | None:
        found = Path(path) if path else None
        ok = found is not None and found.is_dir() and (root is None or inside(found, root))
        return found if ok else None

    issues: list[loadcheck.Issue | None] = []
    load = here(job.load_path)
    for rel, text in sorted(files.items()):
        if not rel.endswith((".json", ".yaml")) or "/" in rel:
            continue
        data = yaml.safe_load(text) if rel.endswith(".yaml") else json.loads(text)
        kind = classify(data, Path(rel).name)
        if kind == "sora_model" and rel != "inference_model.json":
            issues.append(loadcheck.depth_check(data))
            issues.append(loadcheck.pretrained_file_check(data))
            if load is not None:
                issues.append(loadcheck.predictor_check(data, load, root))
        elif kind == "fsdp2_trainer_yaml":
            issues.append(loadcheck.meta_init_check(data))
            native_load = here(loadcheck.dotted(data, "training.load"))
            if native_load is not None:
                hf = here(job.weights_dir)
                issues.append(loadcheck.native_check(data, native_load, hf, job.version.id, root))
    return [
        f"{i.severity}: {i.message}; fix: {i.fix}" for i in issues if i is not None and i.severity != "info"
    ]


def _fit(job: ResolvedJob) -> LayoutFit | None:
    """For a device count other than the stock one: will it fit, and the CP that makes it fit when the
    user set neither TP nor CP (MindSpeed-MM's Megatron DiT jobs, whose heads the CP must divide). The
    stock count keeps the stock layout: it is MindSpeed-MM's own tested choice."""
    par, spec = job.size.parallel_at(job.version.id, job.task.id, job.task.backend), job.spec
    if job.world_size == par.npus_per_node * par.nnodes:
        return None
    request = EstimateRequest(
        model=job.entry.id, size=job.size.id, task=job.task.id, npus=job.world_size, tp=job.tp, cp=job.cp,
        frames=spec.num_frames, height=spec.max_height, width=spec.max_width, text_len=spec.text_len,
        recompute="full" if spec.recompute else "none", device="cpu" if spec.device == "cpu" else None,
    )  # fmt: skip
    arch = job.arch if job.template == "bundled_vlm" else None  # the network the weights hold, not the size's
    if {"tp", "cp"} & spec.model_fields_set:  # the user's own layout: only the verdict
        return fit_layout(request, runtime=job.runtime, arch=arch)
    heads = job.size.arch.get("num_heads")
    return fit_layout(
        request, runtime=job.runtime, cp_ok=cp_rule(job.task.template, job.runtime, heads, job.tp), arch=arch
    )


_STAGE_OF_SCRIPT = {
    "feature_extract/feature_extraction.sh": "extract",
    "pretrain.sh": "train",
    "finetune.sh": "train",
    "train.sh": "train",
    "launch.sh": "train",
    "inference.sh": "sample",
    "evaluate.sh": "evaluate",
}


def training_script(paths: Iterable[str]) -> str | None:
    """Which of a job's files is its training script (the one whose TP, MBS, LOAD_PATH a user confirms: the
    job's other scripts set their own, e.g. inference.sh's LOAD_PATH and feature_extraction.sh's MBS)."""
    have = set(paths)
    return next((rel for rel, stage in _STAGE_OF_SCRIPT.items() if stage == "train" and rel in have), None)


def stage_scripts(spec: JobSpec, *, base: Path | None = None) -> dict[str, str]:
    """{"extract"|"train"|"sample"|"evaluate": script path relative to the job dir} for the stages this job has.

    The job is rendered (in memory) to answer, so the names are exactly the files `render_job` writes,
    for either runtime. `base` is the folder relative paths in the spec are resolved against (the MCP
    workspace, which then also confines what is read).
    """
    job = resolve_job(spec, (base or Path.cwd()) / ".stage-scripts", base=base, root=base)
    files = render_files(job)
    found: dict[str, str] = {}
    for rel, stage in _STAGE_OF_SCRIPT.items():
        if rel in files:
            found.setdefault(stage, rel)
    return found
