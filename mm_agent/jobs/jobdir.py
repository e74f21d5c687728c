"""A rendered job as the launcher sees it: job.yaml, the stage's script and what that script reads.

Nothing is taken on trust from the caller: the script comes from the job's own stage table
(`render.stage_scripts`), must stay inside the job directory (and the workspace over MCP), and the
values the launch depends on (MASTER_PORT, NPUS_PER_NODE, LOAD_PATH, ...) are read from the script the
way bash would assign them (`validate.shell`). Whether the script lets the environment override a value
(`X=${X:-default}`) decides whether the launcher may pick a port or a process count for it.

Over MCP a job may have been rendered elsewhere (by the CLI, from another directory), so its paths are
checked again here, where they are used: every path of the resolved job (`jobspec.confine_job`) and every
path the stage script itself assigns must lie in the workspace or an allowed root, or extraction and
training would read and write outside it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mm_agent.errors import MMAgentError
from mm_agent.jobfile import JOB_FILE, load_job_spec
from mm_agent.jobs.schema import Runtime, Stage
from mm_agent.jobspec import JobSpec, resolve_job
from mm_agent.paths import confine, inside, read_file, resolve, where
from mm_agent.render import stage_scripts
from mm_agent.validate.shell import parse_script

# `NAME=${NAME:-default}` (optionally exported or quoted): the script takes NAME from the environment first.
_OVERRIDE = re.compile(r"""^[ \t]*(?:export[ \t]+)?([A-Z_][A-Z0-9_]*)=["']?\$\{\1:-""", re.M)
# Variables the rendered stage scripts set to a path the stage reads or writes.
PATH_VARS = ("MM_ROOT", "LOAD_PATH", "SAVE_PATH", "DATASET_DIR", "DATASET_FILE", "HF_PATH", "MM_DATA")
MAX_SCRIPT = 1024 * 1024  # a rendered stage script is a few kilobytes


class StageScript(BaseModel):
    """The stage of a job that is about to run, with the script's variables as bash would set them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    job_dir: Path
    stage: Stage
    spec: JobSpec
    script: Path
    vars: dict[str, str | None]
    overridable: frozenset[str]
    root: Path | None = None
    save_path: Path | None = None

    def path(self, value: str) -> Path:
        """A path the job names: absolute as rendered, or relative to the job directory."""
        path = Path(value)
        return path if path.is_absolute() else self.job_dir / path

    @property
    def runtime(self) -> Runtime:
        return self.spec.runtime

    def var(self, name: str) -> str | None:
        value = self.vars.get(name)
        return value if value else None

    def int_var(self, name: str) -> int | None:
        value = self.var(name)
        return int(value) if value is not None and value.isdigit() else None


def resolve_job_dir(job_dir: str, root: Path | None) -> Path:
    """The job directory: confined to the workspace `root` over MCP, else relative to the cwd."""
    path = (
        confine(job_dir, root, "job_dir")
        if root is not None
        else resolve(Path(job_dir).expanduser(), "job_dir")
    )
    if not path.is_dir():
        raise MMAgentError(
            "job directory not found",
            file=str(path),
            fix="render the job first (mm-agent render ... --out DIR --yes) and pass that DIR",
        )
    return path


def load_spec(job_dir: Path, root: Path | None = None) -> JobSpec:
    path = job_dir / JOB_FILE
    if not path.is_file():
        raise MMAgentError(
            f"{JOB_FILE} is missing: this is not a rendered job directory",
            file=str(path),
            fix="render the job with `mm-agent render ... --out DIR --yes` (it writes job.yaml and the scripts)",
        )
    return load_job_spec(path, root)


def _confined_save_path(job_dir: Path, spec: JobSpec, root: Path | None) -> Path:
    """The job resolved as `render_job` would resolve it here; with `root`, each of its paths must lie in
    the workspace or an allowed root (the refusal names the job.yaml field). Returns its save_path."""
    try:
        job = resolve_job(spec, job_dir, base=root or Path.cwd(), root=root)
    except MMAgentError as exc:
        raise MMAgentError(
            exc.message, file=exc.file or str(job_dir / JOB_FILE), field=exc.field, fix=exc.fix
        ) from None
    return Path(job.save_path)


def _confine_script(script: Path, job_dir: Path, env: dict[str, str | None], root: Path) -> None:
    """The paths the script assigns, as rendered: a job rendered from another directory resolved its
    relative paths there, so job.yaml alone does not say where the script reads and writes."""
    for name in PATH_VARS:
        value = env.get(name)
        if value and not inside(job_dir / value, root):  # an absolute value replaces job_dir
            raise MMAgentError(
                f"the script sets {name} to {value}, outside {where(root)}",
                file=str(script),
                field=name,
                fix="re-render the job with paths inside the workspace (render_job, or `mm-agent render "
                "--from job.yaml --out DIR --force --yes` run in the workspace)",
            )


def load_stage(job_dir: Path, stage: Stage, root: Path | None) -> StageScript:
    """The job's script for `stage`, checked to exist and to stay inside the job (and the workspace), with
    every path it uses confined when `root` is given."""
    spec = load_spec(job_dir, root)
    save_path = _confined_save_path(job_dir, spec, root)
    scripts = stage_scripts(spec, base=root)
    rel = scripts.get(stage)
    if rel is None:
        have = ", ".join(sorted(scripts)) or "none"
        raise MMAgentError(
            f"this {spec.model} {spec.task} job has no {stage} stage (its stages: {have})",
            file=str(job_dir / JOB_FILE),
            field="stage",
            fix="run one of the job's stages",
        )
    script = job_dir / rel
    if not script.is_file():
        raise MMAgentError(
            f"the {stage} script is missing from the job",
            file=str(script),
            fix="re-render the job: `"
            + shlex.join(
                ["mm-agent", "render", "--from", str(job_dir / JOB_FILE), "--out", str(job_dir), "--force"]
            )
            + "`",
        )
    real = resolve(script, "script")
    for base in (job_dir, root):
        if base is not None and not real.is_relative_to(base.resolve()):
            raise MMAgentError(
                f"the {stage} script resolves to {real}, outside {base}",
                file=str(script),
                fix="replace the symlink with the rendered script (re-render the job)",
            )
    text = read_file(real, root, field="script", limit=MAX_SCRIPT).decode("utf-8", errors="replace")
    info = parse_script(str(real), text)
    env = dict(info.env)
    if root is not None:
        _confine_script(real, job_dir, env, root)
    if stage == "train" and env.get("SAVE_PATH"):
        save_path = job_dir / str(env["SAVE_PATH"])
    return StageScript(
        job_dir=job_dir,
        stage=stage,
        spec=spec,
        script=real,
        vars=env,
        overridable=frozenset(_OVERRIDE.findall(text)),
        root=root,
        save_path=resolve(save_path, "save_path") if stage == "train" else None,
    )
