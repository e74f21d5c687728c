"""Launcher rules (`launcher.*`): a rendered cluster launcher must start the job it sits in.

Manifests are recognised by content: an Ascend Operator `AscendJob` (mindxdl.gitee.com/v1) or a Volcano
`Job` (batch.volcano.sh/v1alpha1); the shell launchers by name next to job.yaml (`launch_all.sh`,
`slurm.sbatch`). Each is held against job.yaml's `nnodes`/`npus_per_node`:

- `launcher.schema` (error): the manifest breaks its CRD's openAPIV3Schema (kept as data with its source in
  `registry/data/cluster/`), or a pod template breaks Kubernetes' core/v1 PodTemplate schema (checked with
  kubernetes-validate; `launcher.schema_partial` (info) when that package is not installed).
- `launcher.nodes` (error): replicas (Master + Worker, master + worker tasks, minAvailable), `#SBATCH
  --nodes` or launch_all.sh's NNODES differ from the job's nodes; the rendezvous would wait forever.
- `launcher.npus` (error): a container's `huawei.com/Ascend910` request/limit is not npus_per_node.
- `launcher.script` (error): the script it starts is not in the job.
- `launcher.image` (warning): the image is still the placeholder mm-agent renders.
- `launcher.hostfile` (error): a line of a hostfile (`hosts`, `hostfile`, `*.hosts`, ... in the job or
  named on its own) whose host launch_all.sh refuses: not a name, an IPv4/IPv6 address or user@host. Such a
  line reached ssh as an option and a shell (GNU sed's `e` flag) as code before launch_all.sh checked it.
- `launcher.chdir` (error): slurm.sbatch's `#SBATCH --chdir=` value holds what sbatch reads itself in a
  directive line (whitespace, quotes, backslash, `#`): the submit fails, or the rest becomes directives.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from mm_agent.launchers import (
    HOST_FIX,
    IMAGE_PLACEHOLDER,
    LAUNCHER_FILES,
    NPU_RESOURCE,
    bad_hosts,
    sbatch_unsafe,
)
from mm_agent.validate.files import ConfigFile, read_text
from mm_agent.validate.job import Job, is_file, to_int
from mm_agent.validate.rules_ranktable import launch_layout

CRD_DIR = Path(__file__).resolve().parent.parent / "registry" / "data" / "cluster"
# (apiVersion, kind) -> the stored CRD file that defines it.
CRDS = {
    ("mindxdl.gitee.com/v1", "AscendJob"): "ascendjob-crd.yaml",
    ("batch.volcano.sh/v1alpha1", "Job"): "volcano-job-crd.yaml",
}
_EXEC = re.compile(r"^exec bash (.+)$", re.MULTILINE)
_SCRIPT_VAR = re.compile(r"^SCRIPT=(.+)$", re.MULTILINE)
_CHDIR = re.compile(r"^#SBATCH[ \t]+(?:--chdir=|-D[ \t]*)(.*)$", re.MULTILINE)
_REGEN = (
    "re-render it: mm-agent render --from <job dir>/job.yaml --out <job dir> --launcher <launcher> --force"
)


@functools.cache
def crd_schema(name: str) -> dict[str, Any]:
    """The openAPIV3Schema of a stored CRD file."""
    doc = yaml.safe_load((CRD_DIR / name).read_text(encoding="utf-8"))
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _dotted(path: Any) -> str:
    return ".".join(str(p) for p in path) or "<document>"


def schema_problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each place a cluster manifest breaks its CRD schema or a pod template breaks
    core/v1 PodTemplate. Raises ImportError when kubernetes-validate is missing (after the CRD check)."""
    crd = CRDS[(data.get("apiVersion"), data.get("kind"))]  # type: ignore[index]
    import jsonschema  # 40 ms: only for a job that holds a manifest, never at server start-up

    validator = jsonschema.Draft7Validator(crd_schema(crd))
    problems = [(_dotted(e.absolute_path), e.message) for e in validator.iter_errors(data)]
    if problems:
        return problems
    import kubernetes_validate  # a dev extra: Kubernetes' published schemas, kept current by its maintainers

    for where, template in _templates(data):
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        try:
            kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as exc:
            inner = list(exc.path)[1:]  # drop the PodTemplate's own "template"
            problems.append((_dotted([*where, "template", *inner]), exc.message))
    return problems


def _templates(data: dict[str, Any]) -> list[tuple[list[Any], Any]]:
    spec = data.get("spec") or {}
    if data.get("kind") == "AscendJob":
        return [
            (
                [
                    "spec",
                    "replicaSpecs",
                    r,
                ],
                s.get("template"),
            )
            for r, s in (spec.get("replicaSpecs") or {}).items()
        ]
    return [(["spec", "tasks", i], t.get("template")) for i, t in enumerate(spec.get("tasks") or [])]


def _replicas(data: dict[str, Any]) -> list[tuple[str, Any]]:
    spec = data.get("spec") or {}
    if data.get("kind") == "AscendJob":
        return [
            (f"spec.replicaSpecs.{r}.replicas", s.get("replicas", 1))
            for r, s in (spec.get("replicaSpecs") or {}).items()
        ]
    return [(f"spec.tasks.{i}.replicas", t.get("replicas", 1)) for i, t in enumerate(spec.get("tasks") or [])]


def _layout(job: Job) -> tuple[Path | None, int | None, int | None]:
    """job.yaml's directory, nodes and NPUs per node; a size job.yaml leaves to the registry's stock value
    is read from the training launch (as `rules_ranktable` does)."""
    for cfg in job.of_kind("job_yaml"):
        nnodes, npus = to_int(cfg.get("nnodes")), to_int(cfg.get("npus_per_node"))
        launched = next((launch_layout(x) for x in job.launches if x.is_training), (None, None))
        return cfg.path.parent, nnodes or launched[0], npus or launched[1]
    return None, None, None


def _script(job: Job, file: str, raw: str | None, base: Path) -> None:
    try:
        parts = shlex.split(raw) if raw else []
    except ValueError:
        parts = []
    if not parts:
        job.sink.error("launcher.script", file, "the launcher names no training script to start", _REGEN)
        return
    path = Path(parts[0])
    path = path if path.is_absolute() else base / path
    if not is_file(path):
        job.sink.error(
            "launcher.script",
            file,
            f"the launcher starts {parts[0]}, which is not in the job ({path})",
            _REGEN,
        )


def _manifest(job: Job, cfg: ConfigFile, base: Path, nnodes: int | None, npus: int | None) -> None:
    file, data = str(cfg.path), cfg.data
    try:
        problems = schema_problems(data)
    except ImportError:
        problems = []
        job.sink.info(
            "launcher.schema_partial",
            file,
            "pod templates were not checked against Kubernetes' schema (kubernetes-validate is not installed)",
            "pip install kubernetes-validate",
        )
    for field, message in problems:
        job.sink.error(
            "launcher.schema",
            file,
            f"{field}: {message}",
            "fix the field (see docs/launchers.md)",
            field=field,
        )
    if problems:
        return
    counts = _replicas(data)
    total = sum(to_int(n) or 0 for _, n in counts)
    min_available = (
        to_int((data.get("spec") or {}).get("minAvailable")) if data.get("kind") == "Job" else None
    )
    if nnodes is not None and (total != nnodes or min_available not in (None, nnodes)):
        job.sink.error(
            "launcher.nodes",
            file,
            f"the manifest starts {total} pods (minAvailable {min_available}) but the job runs on {nnodes} nodes: "
            "the rendezvous waits for nodes that never come",
            f"one master and {nnodes - 1} workers; {_REGEN}",
            field=counts[0][0] if counts else "spec",
        )
    for where, template in _templates(data):
        for i, container in enumerate(((template or {}).get("spec") or {}).get("containers") or []):
            field = _dotted([*where, "template", "spec", "containers", i])
            resources = container.get("resources") or {}
            for kind in ("requests", "limits"):
                have = to_int((resources.get(kind) or {}).get(NPU_RESOURCE))
                if npus is not None and have != npus:
                    job.sink.error(
                        "launcher.npus",
                        file,
                        f"{field}.resources.{kind} asks for {have} {NPU_RESOURCE} but the job uses {npus} per node",
                        f"set {NPU_RESOURCE}: {npus} in requests and limits",
                        field=f"{field}.resources.{kind}",
                    )
            if container.get("image") == IMAGE_PLACEHOLDER:
                job.sink.warning(
                    "launcher.image",
                    file,
                    f"{field}.image is still the placeholder {IMAGE_PLACEHOLDER!r}",
                    "set it to your training image (CANN, torch_npu and MindSpeed-MM or mm-agent installed)",
                    field=f"{field}.image",
                )
            command = " ".join(str(c) for c in container.get("command") or [])
            found = _EXEC.search(command)
            _script(job, file, found.group(1) if found else None, base)


def _shell(job: Job, path: Path, text: str, nnodes: int | None, pattern: str) -> None:
    found = re.search(pattern, text, re.MULTILINE)
    have = to_int(found.group(1)) if found else None
    if nnodes is not None and have != nnodes:
        job.sink.error(
            "launcher.nodes",
            str(path),
            f"{path.name} starts {have} nodes but the job runs on {nnodes}",
            _REGEN,
        )
    script = _SCRIPT_VAR.search(text)
    _script(job, str(path), script.group(1) if script else None, path.parent)


def _hostfile(job: Job, cfg: ConfigFile) -> None:
    for line, host in bad_hosts(cfg.text):
        job.sink.error(
            "launcher.hostfile",
            str(cfg.path),
            f"{host!r} is not a host name, IPv4/IPv6 address or user@host: launch_all.sh refuses this hostfile "
            "(ssh would read a leading `-` as an option, pdsh `[`, `,` or `^` as host-list syntax)",
            HOST_FIX,
            line=line,
        )


def _chdir(job: Job, path: Path, text: str) -> None:
    for found in _CHDIR.finditer(text):
        unsafe = sbatch_unsafe(found.group(1).rstrip("\r"))
        if unsafe:
            job.sink.error(
                "launcher.chdir",
                str(path),
                f"the #SBATCH --chdir value holds {' '.join(map(repr, unsafe))}: sbatch splits a directive line "
                "at whitespace and reads quotes, backslashes and `#` itself, so the submit fails or the rest of "
                "the line becomes #SBATCH directives of its own",
                "move the job to a directory whose path has none of them and re-render it there "
                "(mm-agent render --from job.yaml with --out set to that directory; render_job out_dir)",
                line=text[: found.start()].count("\n") + 1,
            )


def check(job: Job) -> None:
    for cfg in job.of_kind("hostfile"):
        _hostfile(job, cfg)
    base, nnodes, npus = _layout(job)
    for cfg in list(job.configs.values()):
        if isinstance(cfg.data, dict) and (cfg.data.get("apiVersion"), cfg.data.get("kind")) in CRDS:
            _manifest(job, cfg, base or cfg.path.parent, nnodes, npus)
    if base is None:
        return
    launch_all = base / LAUNCHER_FILES["pdsh"]
    if launch_all in job.scripts:
        _shell(job, launch_all, job.scripts[launch_all].text, nnodes, r"^NNODES=(\d+)$")
    sbatch = base / LAUNCHER_FILES["slurm"]
    if is_file(sbatch):
        text = read_text(sbatch, job.sink, job.root)
        if text is not None:
            _shell(job, sbatch, text, nnodes, r"^#SBATCH --nodes=(\d+)$")
            _chdir(job, sbatch, text)
