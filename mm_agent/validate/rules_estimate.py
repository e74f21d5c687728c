"""Will the rendered job fit its devices (`estimate.over_budget`)?

A job directory with a job.yaml is estimated as `estimate_resources` does it (mm_agent/estimate): when the
memory per device exceeds the device's (the job's device, else a 64 GB Ascend 910B), the warning names the
estimate, its largest parts and the best lever as the fix (MoE models are left out: expert parallelism is not
modelled, so their estimate is an upper bound). Out-of-memory otherwise shows up minutes into the
launch, after the checkpoint has loaded.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.estimate import EstimateRequest, estimate_resources
from mm_agent.estimate.core import MOE_NOTE
from mm_agent.jobfile import JOB_FILE
from mm_agent.validate.job import Job


def _job_dirs(job: Job) -> list[Path]:
    dirs = {p.parent for p in (*job.scripts, *job.configs)}
    return sorted(d for d in dirs if (d / JOB_FILE).is_file())


def check(job: Job) -> None:
    # the texts this validation has read, not read again (the estimate reads job.yaml, scripts, data configs)
    known = {path: f.text for path, f in job.configs.items() if f.text}
    known.update((path, f.text) for path, f in job.scripts.items())
    for job_dir in _job_dirs(job):
        try:
            request = EstimateRequest(job_dir=str(job_dir))
            result = estimate_resources(request, root=job.root, levers="over_budget", known=known)
        except (MMAgentError, ValidationError):
            continue  # a job the estimator cannot read: the other rules report what is wrong with it
        if result.fits or MOE_NOTE in result.notes:
            continue  # (an MoE estimate without expert parallelism is an upper bound, not a verdict)
        top = sorted(result.breakdown.items(), key=lambda kv: -kv[1])[:3]
        parts = ", ".join(f"{name} {gb:g}" for name, gb in top)
        fix = (
            f"{result.levers[0].change} (estimate {result.levers[0].per_device_gb:g} GB)"
            if result.levers
            else "use devices with more memory, or a smaller model size"
        )
        job.sink.warning(
            "estimate.over_budget",
            str(job_dir / JOB_FILE),
            f"estimated {result.per_device_gb:g} GB per device, over the {result.device_gb:g} GB of {result.device} "
            f"(largest: {parts} GB); `{shlex.join(['mm-agent', 'estimate', str(job_dir)])}` itemises it",
            fix,
        )
