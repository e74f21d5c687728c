"""Job management: start the stages of a rendered job as supervised torchrun runs, report on them, stop them.

`start_stage` (launch.py) checks the job and starts `bash <stage script>` in its own process group under
a supervisor (supervise.py) that writes progress, watches the log with the diagnoser and writes the final
report; `job_status`/`list_jobs`/`tail_logs`/`wait_job` (status.py) read a run, job stage or conversion;
`stop_job` (stop.py) stops one run's processes and nothing else. Runs cannot collide: a run whose
processes still live, supervised or orphaned, holds its job and save_path (holders.py), and a training
never resumes a checkpoint written by another job (resume.py). Nothing here imports torch.
"""

from __future__ import annotations

from mm_agent.jobs.launch import start_stage
from mm_agent.jobs.schema import (
    JobList,
    JobStatus,
    JobStatusRequest,
    LaunchRequest,
    LogTail,
    StageLaunch,
    StageRequest,
    StopJobRequest,
    StopJobResult,
    StopTarget,
    TailRequest,
)
from mm_agent.jobs.status import job_status, list_jobs, tail_logs, wait_job
from mm_agent.jobs.stop import stop, stop_job

__all__ = [
    "JobList",
    "JobStatus",
    "JobStatusRequest",
    "LaunchRequest",
    "LogTail",
    "StageLaunch",
    "StageRequest",
    "StopJobRequest",
    "StopJobResult",
    "StopTarget",
    "TailRequest",
    "job_status",
    "list_jobs",
    "start_stage",
    "stop",
    "stop_job",
    "tail_logs",
    "wait_job",
]
