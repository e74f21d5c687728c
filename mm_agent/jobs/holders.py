"""Which earlier runs still hold a job: a job's lock is held by its processes, not only by its supervisor.

A supervisor killed with SIGKILL leaves its stage behind: torchrun and the ranks keep training, and
writing checkpoints, with nobody watching. Such a run reads as "killed", yet a second launch of the job
would start a second training into the same folders. So every run with a live recorded stage process
(running, or killed with orphans, verified by PID and start time in `status.stage_processes`) holds its
job directory, its ports and, for training, its save_path, until it ends or `stop_job` stops it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.jobs.schema import STAGES, JobRequest
from mm_agent.jobs.status import list_jobs
from mm_agent.runs import REQUEST, read_json


class Holder(BaseModel):
    """A run whose processes still live."""

    run_id: str
    request: JobRequest
    pids: list[int]
    orphaned: bool


def holders() -> list[Holder]:
    """Job runs that are running, or whose supervisor is gone while stage processes still live."""
    found = []
    for run in list_jobs().jobs:
        if run.kind not in STAGES or not (run.state == "running" or run.orphans):
            continue
        try:
            request = JobRequest.model_validate(read_json(Path(run.run_dir) / REQUEST))
        except ValidationError:
            continue
        found.append(Holder(run_id=run.run_id, request=request, pids=run.pids, orphaned=bool(run.orphans)))
    return found


def _what(holder: Holder) -> str:
    if holder.orphaned:
        pids = ", ".join(map(str, holder.pids))
        return f"lost its supervisor, but {len(holder.pids)} of its processes still run (PIDs {pids})"
    return "is still running"


def refuse_collision(job_dir: Path, save_path: Path | None, live: list[Holder]) -> None:
    """Refuse a launch of a job that a live run holds, or a training into a save_path one writes to."""
    for other in live:
        stop = f"`mm-agent stop {other.run_id} --yes` (stop_job run_id={other.run_id} confirm=true)"
        if Path(other.request.job_dir) == job_dir:
            raise MMAgentError(
                f"run {other.run_id} ({other.request.stage} stage of this job) {_what(other)}",
                file=str(job_dir),
                fix=f"follow it with `mm-agent status {other.run_id}` / job_status, or stop it first: {stop}",
            )
        if save_path is not None and other.request.save_path == str(save_path):
            raise MMAgentError(
                f"training run {other.run_id} of the job in {other.request.job_dir} {_what(other)} and "
                f"writes its checkpoints to {save_path}",
                file=str(job_dir),
                field="save_path",
                fix=f"stop it first ({stop}), or re-render this job with a save_path of its own",
            )
