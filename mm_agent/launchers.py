"""Cluster launchers for a multi-node job: the file that starts the job's training script on every node.

The per-node scripts already read NODE_RANK/NNODES/MASTER_ADDR/MASTER_PORT from the environment; a launcher
only supplies them, the way its cluster names them: `pdsh` (launch_all.sh over a hostfile, ssh when pdsh is
missing), `ascendjob` (Ascend Operator: RANK is the node rank, WORLD_SIZE the NPUs of the job), `volcano`
(VC_TASK_INDEX and the svc plugin's host names) and `slurm` (SLURM_NODEID, the first host of the allocation).
See docs/launchers.md for the mapping and where the manifests' schemas come from.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from mm_agent.errors import MMAgentError
from mm_agent.jobspec import LAUNCHER_FILES, Launcher, ResolvedJob
from mm_agent.templating import jinja_environment, templates_dir

# What a manifest's image is until the user sets it; the validator warns while it is there.
IMAGE_PLACEHOLDER = "IMAGE"
NPU_RESOURCE = "huawei.com/Ascend910"
ASCEND_OPERATOR_PORT = 2222  # ascend-operator pkg/api/v1/constants.go DefaultPort
HCCL_CONNECT_TIMEOUT = 1200  # seconds, as MindSpeed-MM's stock multi-node scripts set it
HCCL_BASE_PORT = 60000  # HCCL_IF_BASE_PORT's default
HCCL_PORT_STRIDE = 16  # one host port per NPU, 16 NPUs at most per node


def k8s_name(job: ResolvedJob) -> str:
    """A DNS-1123 name for the job's cluster objects (and its Volcano host names), from the job directory."""
    base = re.sub(r"[^a-z0-9-]+", "-", Path(job.job_dir).name.lower()).strip("-")
    return ("mm-" + base)[:40].rstrip("-") or "mm-job"


def mounts(job: ResolvedJob) -> list[str]:
    """The directories a pod must see at the same paths as the job's scripts: the job, its inputs and
    outputs (and the MindSpeed-MM checkout), each given once (one inside another is covered by it)."""
    paths = [job.job_dir, job.weights_dir, job.load_path, job.dataset_dir, job.save_path, job.feature_dir]
    if job.runtime == "mindspeed-mm":
        paths.append(job.mm_root)
    unique = sorted({Path(p) for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return [str(p) for p in kept]


def render_launcher(job: ResolvedJob, launcher: Launcher, script: str) -> dict[str, str]:
    """{file name: text} of `launcher` for a job whose training stage is the job-relative `script`."""
    name = LAUNCHER_FILES[launcher]
    env = jinja_environment(str(templates_dir()))
    context: dict[str, Any] = {
        "job": job,
        "script": script,
        "name": k8s_name(job),
        "mounts": mounts(job),
        "image": IMAGE_PLACEHOLDER,
        "npu_resource": NPU_RESOURCE,
        "ascend_port": ASCEND_OPERATOR_PORT,
        "hccl_connect_timeout": HCCL_CONNECT_TIMEOUT,
        "hccl_base_port": HCCL_BASE_PORT,
        "hccl_port_stride": HCCL_PORT_STRIDE,
    }
    template = f"_common/launchers/{name}.j2"
    try:
        text = env.get_template(template).render(**context)
    except TemplateError as exc:
        raise MMAgentError(
            f"template {template} failed: {exc}", file=template, fix="this is an mm-agent bug"
        ) from exc
    return {name: text}


def launcher_steps(job: ResolvedJob, launcher: Launcher) -> list[str]:
    """How to start the job through its launcher, after the steps that prepare it."""
    d = job.job_dir
    path = shlex.quote(d + "/" + LAUNCHER_FILES[launcher])
    shared = f"# every node needs {d} (and the paths it reads) at the same path: shared storage"
    if launcher == "pdsh":
        return [
            shared,
            f"# write {d}/hosts: one host per line, node 0 (the master) first, {job.nnodes} in all",
            f"bash {path} {shlex.quote(d + '/hosts')}",
        ]
    if launcher == "slurm":
        return [shared, f"sbatch {path}"]
    return [
        shared,
        f"# set the image in {LAUNCHER_FILES[launcher]} (now {IMAGE_PLACEHOLDER!r}) to your training image",
        f"kubectl apply -f {path}",
    ]
