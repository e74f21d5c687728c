"""`start_stage`: start one stage of a rendered job as a supervised background run, or say how it would.

The dry run (the default) checks everything a real start checks (job.yaml, the script, the stage's
inputs, the ports) and returns the exact command and environment; nothing starts. Confirmed, the stage
is recorded as a run (`mm_agent.runs`) whose worker is the supervisor (`python -m
mm_agent.jobs.supervise`, started through `procs.spawn` in a session of its own so it outlives the CLI
call), and the run id comes back at once; `job_status` reports on it from then on.

Both refuse a launch that would collide with an earlier run: one whose processes still live holds the
job and its save_path (`holders`), and a training never resumes a checkpoint another job wrote (`resume`;
a confirmed training records itself as the writer of its save_path before it starts).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from mm_agent.errors import MMAgentError
from mm_agent.jobs.holders import holders, refuse_collision
from mm_agent.jobs.inputs import check_inputs
from mm_agent.jobs.jobdir import StageScript, load_stage, resolve_job_dir
from mm_agent.jobs.ports import (
    HCCL_SPAN,
    bindable,
    launch_lock,
    npu_host,
    pick_hccl_base,
    pick_master_port,
)
from mm_agent.jobs.resume import check_resume, claim
from mm_agent.jobs.schema import STAGE_FILE, JobRequest, StageLaunch, StageRecord, StageRequest
from mm_agent.runs import REPORT, read_json, runs_dir, start_run

# Environment a caller may add: device selection and communication tuning only. Anything that can make a
# process load code (LD_PRELOAD, PYTHONPATH, BASH_ENV, PYTHON, PATH, ...) is refused.
_ENV_NAMES = frozenset(
    {
        "MM_AGENT_DEVICE",
        "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "PYTORCH_NPU_ALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "TORCH_DISTRIBUTED_DEBUG",
    }
)
_ENV_PREFIXES = ("HCCL_", "NCCL_", "TORCH_NCCL_")
PGID_WAIT_S = 5.0
SUPERVISOR = [sys.executable, "-m", "mm_agent.jobs.supervise"]


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """The caller's extra variables, if every one is on the allowlist (names and values are already
    bounded and single-line by the request model)."""
    for name in env:
        if name not in _ENV_NAMES and not name.startswith(_ENV_PREFIXES):
            raise MMAgentError(
                f"environment variable {name!r} may not be set for a job",
                field=f"env.{name}",
                fix="only device/communication variables are accepted: "
                + ", ".join(sorted(_ENV_NAMES))
                + ", HCCL_*, NCCL_*, TORCH_NCCL_*; set others in the job script",
            )
    return dict(env)


def _ports(
    job: StageScript, req: StageRequest, live: list[JobRequest], env: dict[str, str]
) -> dict[str, str]:
    """MASTER_PORT / NPUS_PER_NODE / HCCL_IF_BASE_PORT overrides for this launch."""
    out: dict[str, str] = {}
    if req.nproc_per_node is not None:
        if "NPUS_PER_NODE" not in job.overridable:
            raise MMAgentError(
                "this script fixes NPUS_PER_NODE, so nproc_per_node cannot change it",
                file=str(job.script),
                field="nproc_per_node",
                fix="re-render the job with --npus-per-node N (or leave nproc_per_node unset)",
            )
        out["NPUS_PER_NODE"] = str(req.nproc_per_node)
    taken = [j.master_port for j in live if j.master_port is not None]
    script_port = job.int_var("MASTER_PORT")
    multi_node = (job.int_var("NNODES") or 1) > 1
    if script_port is not None and "MASTER_PORT" in job.overridable and not multi_node:
        out["MASTER_PORT"] = str(pick_master_port(script_port, taken))
    elif (
        script_port is not None
        and (job.int_var("NODE_RANK") or 0) == 0
        and (script_port in taken or not bindable(script_port))
    ):
        # Every node must agree on the port, or the script does not take it from the environment:
        # it must be free as written.
        raise MMAgentError(
            f"MASTER_PORT {script_port} is in use (by another job, or see `mm-agent doctor`)",
            file=str(job.script),
            field="MASTER_PORT",
            fix="stop the job holding it, or re-render with --master-port set to a free port",
        )
    hccl_set = any(k in env or k in os.environ for k in ("HCCL_IF_BASE_PORT", "HCCL_HOST_SOCKET_PORT_RANGE"))
    if npu_host() and not hccl_set:
        bases = [j.hccl_if_base_port for j in live if j.hccl_if_base_port is not None]
        out["HCCL_IF_BASE_PORT"] = str(pick_hccl_base(bases))
    return out


def _wait_pgid(run_dir: Path) -> int | None:
    """The stage's process group, once the supervisor has started it (it takes a fraction of a second)."""
    end = time.monotonic() + PGID_WAIT_S
    while time.monotonic() < end:
        raw = read_json(run_dir / STAGE_FILE)
        if raw is not None:
            return StageRecord.model_validate(raw).pgid
        if read_json(run_dir / REPORT) is not None:
            return None
        time.sleep(0.05)
    return None


def start_stage(req: StageRequest, root: Path | None = None) -> StageLaunch:
    """Dry run (`req.confirm` False): what would run. Confirmed: start it and return the run id at once.

    `root` (the MCP workspace) confines the job directory, its script and every path the stage reads
    or writes.
    """
    job_dir = resolve_job_dir(req.job_dir, root)
    job = load_stage(job_dir, req.stage, root)
    env = check_env(req.env)
    checked = check_inputs(job)
    argv = ["bash", str(job.script)]
    # The lock makes pick + record atomic across launches; a dry run records nothing, so it needs none
    # (and leaves no state directory behind).
    with launch_lock(runs_dir()) if req.confirm else contextlib.nullcontext():
        live = holders()
        refuse_collision(job_dir, job.save_path, live)
        if job.save_path is not None:
            check_resume(job_dir, job.spec, job.save_path, root)
        overrides = _ports(job, req, [h.request for h in live], env)
        full_env = {**env, **overrides, "PYTHONUNBUFFERED": "1"}
        port = overrides.get("MASTER_PORT") or (str(job.int_var("MASTER_PORT") or "") or None)
        hccl = overrides.get("HCCL_IF_BASE_PORT")
        nproc = req.nproc_per_node or job.int_var("NPUS_PER_NODE")
        launch = StageLaunch(
            status="dry_run",
            job_dir=str(job_dir),
            stage=req.stage,
            runtime=job.runtime,
            script=str(job.script),
            argv=argv,
            env=full_env,
            master_port=int(port) if port else None,
            hccl_if_base_port=int(hccl) if hccl else None,
            nproc_per_node=nproc,
            checked=checked,
            save_path=str(job.save_path) if job.save_path else None,
            message="",
        )
        command = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(full_env.items()))
        command += " " + shlex.join(argv)
        if not req.confirm:
            ports = f" (HCCL host ports {hccl}-{int(hccl) + HCCL_SPAN - 1})" if hccl else ""
            launch.message = (
                f"dry run: would run `{command}` in its own process group under a supervisor{ports}; "
                "start it with confirm=true (CLI: --yes)"
            )
            return launch
        request = JobRequest(
            job_dir=str(job_dir),
            stage=req.stage,
            runtime=job.runtime,
            script=str(job.script),
            argv=argv,
            env=full_env,
            master_port=launch.master_port,
            hccl_if_base_port=launch.hccl_if_base_port,
            nproc_per_node=nproc,
            stop_grace_s=req.stop_grace_s,
            spec=job.spec.model_dump(mode="json", exclude_none=True),
            save_path=launch.save_path,
        )
        if job.save_path is not None:
            claim(job_dir, job.spec, job.save_path, root)
        info = start_run(req.stage, list(SUPERVISOR), request, job_dir, new_session=True, workspace=root)
    launch.status = "started"
    launch.run_id = info.run_id
    launch.supervisor_pid = info.pid
    launch.log = info.log
    launch.pgid = _wait_pgid(Path(info.run_dir))
    launch.message = (
        f"{req.stage} started as run {info.run_id} (log {info.log}); follow it with job_status / "
        f"`mm-agent status {info.run_id}`, stop it with `mm-agent stop {info.run_id} --yes`"
    )
    return launch
