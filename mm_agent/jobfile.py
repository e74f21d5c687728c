"""A rendered job's job.yaml: its name, reading it back, and JobSpec errors in the user's terms.

Kept apart from render.py so that what only reads a job (the estimator, the doctor, the job manager) does
not pull in the templates, and render can use the estimator without an import circle.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from mm_agent import yamlload
from mm_agent.errors import MMAgentError
from mm_agent.jobspec import JobSpec
from mm_agent.memo import remembered
from mm_agent.names import not_text
from mm_agent.paths import read_file

JOB_FILE = "job.yaml"
MAX_JOB_YAML = 256 * 1024  # a job.yaml is a few hundred bytes


def spec_error(exc: ValidationError, file: str | None = None) -> MMAgentError:
    """A JobSpec validation error as the user-facing error: the field, pydantic's reason, the fix."""
    err = exc.errors()[0]
    if (unreadable := not_text(err)) is not None:  # a path whose name is not UTF-8 (from the command line)
        return MMAgentError(unreadable.message, file=file, field=unreadable.field, fix=unreadable.fix)
    field = ".".join(map(str, err["loc"])) or None
    message = str(err["msg"]).removeprefix("Value error, ")
    return MMAgentError(
        message,
        file=file,
        field=field,
        fix="correct the field (see `mm-agent render --help`)",
    )


def load_job_spec(path: Path, root: Path | None = None) -> JobSpec:
    """Read a job.yaml back (for `render --from`, the launcher, the doctor); with `root`, the file must be
    a regular file inside it (`paths.read_file`)."""
    try:
        text = read_file(path, root, field="job", limit=MAX_JOB_YAML).decode("utf-8")
        raw = remembered("job.yaml", None, text, lambda: yamlload.safe_load(text))
    except yamlload.YAMLLimit as exc:  # an alias bomb: refused before pydantic walks it
        raise MMAgentError(f"cannot read job spec: {exc.message}", file=str(path), fix=exc.fix) from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise MMAgentError(
            f"cannot read job spec: {exc}", file=str(path), fix="pass the job.yaml of a rendered job"
        ) from exc
    except MMAgentError as exc:
        raise MMAgentError(
            f"cannot read job spec: {exc.message}",
            file=str(path),
            fix=exc.fix or "pass the job.yaml of a rendered job",
        ) from None
    if not isinstance(raw, dict):
        raise MMAgentError(
            "job spec is not a mapping of fields", file=str(path), fix="pass the job.yaml of a rendered job"
        )
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error(exc, str(path)) from exc
