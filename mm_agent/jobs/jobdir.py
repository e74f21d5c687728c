"""A rendered job as the launcher sees it: job.yaml, the stage's script and what that script reads.

Nothing is taken on trust from the caller: the script comes from the job's own stage table
(`jobspec.stage_scripts`), must stay inside the job directory (and the workspace over MCP), and the
values the launch depends on (MASTER_PORT, NPUS_PER_NODE, LOAD_PATH, ...) are read from the script the
way bash would assign them (`validate.shell`). Whether the script lets the environment override a value
(`X=${X:-default}`) decides whether the launcher may pick a port or a process count for it.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mm_agent.errors import MMAgentError
from mm_agent.jobs.schema import Runtime, Stage
from mm_agent.jobspec import JobSpec, stage_scripts
from mm_agent.paths import confine
from mm_agent.render import JOB_FILE, load_job_spec
from mm_agent.validate.shell import parse_script

# `NAME=${NAME:-default}` (optionally exported or quoted): the script takes NAME from the environment first.
_OVERRIDE = re.compile(r"""^[ \t]*(?:export[ \t]+)?([A-Z_][A-Z0-9_]*)=["']?\$\{\1:-""", re.M)


class StageScript(BaseModel):
    """The stage of a job that is about to run, with the script's variables as bash would set them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    job_dir: Path
    stage: Stage
    spec: JobSpec
    script: Path
    vars: dict[str, str | None]
    overridable: frozenset[str]

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
    path = confine(job_dir, root) if root is not None else Path(job_dir).expanduser().resolve()
    if not path.is_dir():
        raise MMAgentError(
            "job directory not found",
            file=str(path),
            fix="render the job first (mm-agent render ... --out DIR --yes) and pass that DIR",
        )
    return path


def load_spec(job_dir: Path) -> JobSpec:
    path = job_dir / JOB_FILE
    if not path.is_file():
        raise MMAgentError(
            f"{JOB_FILE} is missing: this is not a rendered job directory",
            file=str(path),
            fix="render the job with `mm-agent render ... --out DIR --yes` (it writes job.yaml and the scripts)",
        )
    return load_job_spec(path)


def load_stage(job_dir: Path, stage: Stage, root: Path | None) -> StageScript:
    """The job's script for `stage`, checked to exist and to stay inside the job (and the workspace)."""
    spec = load_spec(job_dir)
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
            fix=f"re-render the job (mm-agent render --from {job_dir / JOB_FILE} --out {job_dir} --force --yes)",
        )
    real = script.resolve()
    for base in (job_dir, root):
        if base is not None and not real.is_relative_to(base.resolve()):
            raise MMAgentError(
                f"the {stage} script resolves to {real}, outside {base}",
                file=str(script),
                fix="replace the symlink with the rendered script (re-render the job)",
            )
    text = real.read_text(encoding="utf-8", errors="replace")
    info = parse_script(str(real), text)
    return StageScript(
        job_dir=job_dir,
        stage=stage,
        spec=spec,
        script=real,
        vars=dict(info.env),
        overridable=frozenset(_OVERRIDE.findall(text)),
    )
