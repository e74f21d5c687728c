"""Whose checkpoint is in a save_path: a training never resumes another job's checkpoint by accident.

The bundled runtime (`--auto-resume`), like any Megatron run pointed at a folder holding a checkpoint,
continues from what it finds in its save_path. A second job pointed at the first one's save_path would
then "resume" it, train zero steps and report success. So a confirmed train launch records beside the
checkpoint which job writes it (`mm_agent_job.json`: the job directory and a hash of the spec fields that
make a checkpoint another experiment), and a launch into a save_path whose checkpoint (tracker file) was
recorded for another job, for this job as a different experiment, or by nothing at all, is refused
with the fix. train_iters, lr and the save interval are not part of the identity: continuing a job with
more iterations must still resume it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from mm_agent.errors import MMAgentError, os_error
from mm_agent.jobfile import JOB_FILE
from mm_agent.jobspec import DEFAULT_SEED, JobSpec
from mm_agent.paths import open_dir, read_file
from mm_agent.runs import utc_now

TRACKER = "latest_checkpointed_iteration.txt"
RECORD = "mm_agent_job.json"
MAX_RECORD = 64 * 1024
# JobSpec fields that make a checkpoint belong to another experiment.
IDENTITY = (
    "model",
    "task",
    "backend",
    "size",
    "runtime",
    "weights_dir",
    "load_path",
    "dataset_dir",
    "dataset_file",
    "feature_dir",
    "num_frames",
    "max_height",
    "max_width",
    "text_len",
    "seed",
)


class CheckpointOwner(BaseModel):
    """mm_agent_job.json: the job that writes the checkpoints in this folder."""

    job_dir: str
    identity: str = Field(description="sha256 of `fields`")
    fields: dict[str, Any] = Field(description="the spec fields that make the experiment")
    recorded: str


def identity_fields(spec: JobSpec) -> dict[str, Any]:
    """The experiment a checkpoint belongs to; an unset seed is the default one it trains with."""
    fields = {name: getattr(spec, name) for name in IDENTITY}
    fields["seed"] = DEFAULT_SEED if spec.seed is None else spec.seed
    fields["size"] = spec.size.lower() if spec.size else None
    return fields


def _digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def owner_of(job_dir: Path, spec: JobSpec) -> CheckpointOwner:
    fields = identity_fields(spec)
    return CheckpointOwner(job_dir=str(job_dir), identity=_digest(fields), fields=fields, recorded=utc_now())


def _recorded(save_path: Path, root: Path | None) -> CheckpointOwner | None:
    path = save_path / RECORD
    if not path.exists():
        return None
    try:
        return CheckpointOwner.model_validate_json(read_file(path, root, field="save_path", limit=MAX_RECORD))
    except (MMAgentError, ValidationError):
        return None  # unreadable: as good as no record


def check_resume(job_dir: Path, spec: JobSpec, save_path: Path, root: Path | None) -> None:
    """Refuse a training whose save_path holds a checkpoint that is not this job's (same directory, same
    experiment): it would resume that checkpoint instead of training this job."""
    if not (save_path / TRACKER).exists():
        return
    mine = owner_of(job_dir, spec)
    other = _recorded(save_path, root)
    render = shlex.join(["mm-agent", "render", "--from", str(job_dir / JOB_FILE), "--out", str(job_dir)])
    fix = (
        f"re-render this job with a save_path of its own (`{render} --save-path <new dir> --force`; "
        f"render_job with save_path over MCP), or move {save_path} away to start over"
    )
    if other is None:
        what = f"no {RECORD} says which job wrote it"
    elif other.job_dir != mine.job_dir:
        what = f"it was written by the job in {other.job_dir}"
    elif other.identity != mine.identity:
        changed = sorted(k for k in mine.fields if other.fields.get(k) != mine.fields[k])
        what = f"it was written by this job when it was another experiment ({', '.join(changed)} changed)"
    else:
        return
    raise MMAgentError(
        f"save_path {save_path} already holds a checkpoint and {what}; training would resume it "
        "instead of training this job",
        file=str(save_path / RECORD),
        field="save_path",
        fix=fix,
    )


def claim(job_dir: Path, spec: JobSpec, save_path: Path, root: Path | None) -> None:
    """Record this job as the writer of `save_path` (created if missing), atomically: the record is
    written to a temp file and renamed, all through one descriptor of the folder (no symlink followed
    below the root)."""
    text = owner_of(job_dir, spec).model_dump_json(indent=2)
    tmp = f".{RECORD}.{secrets.token_hex(4)}.tmp"
    try:
        fd = open_dir(save_path, root, "save_path", create=True)
    except OSError as exc:
        raise os_error(exc, file=str(save_path), field="save_path") from None
    try:
        out = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd
        )
        with os.fdopen(out, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, RECORD, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise os_error(exc, file=str(save_path / RECORD), field="save_path") from None
    finally:
        os.close(fd)
