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
import unicodedata
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


# A hostfile's host (launch_all.sh holds the same pattern): a name, an IPv4 or IPv6 address (with a %zone),
# optionally after user@. Anything else would reach ssh as an option (a leading `-`), pdsh as host-list
# syntax (`[01-08]`, `,`, `^file`) or a shell as code.
HOST_RE = re.compile(
    r"([A-Za-z0-9_][A-Za-z0-9._-]*@)?"
    r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9._-]+)?)",
    re.ASCII,
)
MAX_HOST = 255
HOST_FIX = (
    "write one host per line, node 0 first: a name (letters, digits, . - _), an IPv4 or IPv6 address, or "
    "user@host, then optional words such as slots=8"
)
# What sbatch reads itself in an `#SBATCH` line (src/sbatch/opt.c, _get_argument): whitespace ends an
# argument (the rest of the line becomes more directives), quotes group, a backslash escapes, and an
# unescaped `#` starts a comment.
_SBATCH_SPECIAL = frozenset("\"'\\#")


def bad_hosts(text: str) -> list[tuple[int, str]]:
    """(1-based line, host) for each hostfile line whose first word launch_all.sh refuses. Lines are read
    as bash's `read` does: split at newlines only (a CR stays in the name), the first blank- or tab-separated
    word is the host, empty lines and `#` comments are skipped."""
    out: list[tuple[int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        host = re.split(r"[ \t]+", line.strip(" \t"))[0]
        if not host or host.startswith("#"):
            continue
        if len(host) > MAX_HOST or HOST_RE.fullmatch(host) is None:
            out.append((number, host))
    return out


def sbatch_unsafe(text: str) -> list[str]:
    """The characters of `text` that sbatch would not read literally after `#SBATCH --chdir=`."""
    return sorted(
        {c for c in text if c.isspace() or c in _SBATCH_SPECIAL or unicodedata.category(c).startswith("C")}
    )


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
    # dict.fromkeys, not a set: a set's order follows the process's hash seed, and so would the manifest's
    # volume list (a re-render from another process would then read as a different job)
    unique = sorted(dict.fromkeys(Path(p) for p in paths), key=lambda p: (len(p.parts), str(p)))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return [str(p) for p in kept]


def check_job_dir(job: ResolvedJob) -> None:
    """Refuse (at render) a Slurm job whose directory slurm.sbatch cannot name in its `#SBATCH --chdir=`
    line: sbatch would fail the submit, or read the rest of the path as directives of its own
    (` --export=ALL,LD_PRELOAD=...`)."""
    unsafe = sbatch_unsafe(job.job_dir) if job.spec.launcher == "slurm" else []
    if unsafe:
        raise MMAgentError(
            f"out_dir {job.job_dir} cannot be written in slurm.sbatch's `#SBATCH --chdir=` line: sbatch splits "
            f"that line at whitespace and reads quotes, backslashes and `#` itself ({' '.join(map(repr, unsafe))} "
            "here), so the submit would fail or the rest of the path would become #SBATCH directives",
            field="out_dir",
            fix="render into a directory whose path has no whitespace, quotes, backslash or `#` (e.g. "
            "jobs/wan-slurm), or use another launcher (pdsh, ascendjob and volcano quote the path)",
        )


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
