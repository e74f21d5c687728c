"""What the MCP server exposes as resources: the model catalog, one registry entry with its pipeline, the
files of rendered jobs in the workspace, and the generated Agent Skills.

Plain functions (the server only adapts them), so the confinement rules are testable without a client.
Job files are served only from directories that hold a `job.yaml` (what `render_job` writes), inside the
workspace after symlinks are resolved, never hidden files (`.env`, `.ssh`), and only as UTF-8 text up to
`MAX_FILE_BYTES`: a host may attach a resource to the model's context unasked, so a resource must never
be a way to read more than the tools already can.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import yaml
from pydantic import BaseModel, ConfigDict, Field

from mm_agent import cancel
from mm_agent.catalog import ListModelsRequest, ModelList, list_models
from mm_agent.errors import MMAgentError
from mm_agent.jobfile import JOB_FILE
from mm_agent.jobspec import Runtime
from mm_agent.names import is_utf8
from mm_agent.paths import confine, read_file
from mm_agent.pipeline import PipelineStage
from mm_agent.registry import get_registry
from mm_agent.registry.schema import ModelEntry
from mm_agent.route import RouteRequest, route_model
from mm_agent.skills.build import NAME_RE, SKILL_MD, skills_dir
from mm_agent.uris import MAX_FILE_BYTES, SCHEME, SKILL_SCHEME, UnknownResource

# resources/list walks the workspace on every call: bounded so a workspace full of dataset files stays fast
JOB_SEARCH_DEPTH = 3
MAX_DIRS_SCANNED = 2000
MAX_LISTED_JOBS = 20
MAX_LISTED_FILES_PER_JOB = 50
# (.md: the job README, which lists the model's cited steps with the job's paths)
LISTED_SUFFIXES = frozenset({".sh", ".json", ".yaml", ".yml", ".txt", ".md"})


class ModelDetail(BaseModel):
    """A registry entry plus the pipeline `route_model` picks for it when only the model is named."""

    model_config = ConfigDict(extra="forbid")

    model: ModelEntry
    mm_version: str
    task: str = Field(description="the default task (route_model's first pick for this model)")
    backend: str
    size: str
    runtime: Runtime
    pipeline: list[PipelineStage]


class JobFileRef(BaseModel):
    """A file of a rendered job, as listed in resources/list."""

    model_config = ConfigDict(extra="forbid")

    uri: str
    job_dir: str = Field(description="the job directory, relative to the workspace")
    path: str = Field(description="the file, relative to the workspace")
    bytes: int


class JobFileText(BaseModel):
    """What reading a job-file URI returns: the file's text, or for a job directory a JSON index."""

    model_config = ConfigDict(extra="forbid")

    job_dir: str
    path: str
    text: str


def model_catalog() -> ModelList:
    """`mm-agent://models`: the same catalog `list_models` returns with no filter."""
    return list_models(ListModelsRequest())


def model_detail(model_id: str) -> ModelDetail:
    """`mm-agent://models/{model_id}`: the entry by exact registry id (ids are what the catalog lists)."""
    reg = get_registry()
    try:
        entry = reg.get(model_id)
    except MMAgentError as exc:
        raise UnknownResource(exc.message, field="model_id", fix=exc.fix) from exc
    routed = route_model(RouteRequest(model=entry.id))
    top = next(c for c in routed.candidates if c.model_id == entry.id)
    return ModelDetail(
        model=entry,
        mm_version=top.mm_version,
        task=top.task,
        backend=top.backend,
        size=top.size,
        runtime=top.runtime,
        pipeline=top.pipeline,
    )


def job_uri(rel: str) -> str:
    """The URI of a workspace-relative path under the `mm-agent://jobs/{+path}` template."""
    return f"{SCHEME}jobs/{quote(rel, safe='/')}"


def _refuse(path: str, why: str) -> UnknownResource:
    return UnknownResource(
        f"job file {path!r} {why}",
        field="path",
        fix="read a file of a rendered job (a directory with job.yaml) by its workspace-relative path, "
        "as listed in resources/list",
    )


def _resolve_in_workspace(path: str, root: Path) -> Path:
    """Relative, no `..`, no hidden component, and inside the workspace once symlinks are followed."""
    parts = PurePosixPath(path).parts
    if not path or "\x00" in path or "\\" in path or path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise _refuse(path, "is not a workspace-relative path")
    if ".." in parts:
        raise _refuse(path, "contains '..'")
    if any(p.startswith(".") for p in parts):
        raise _refuse(path, "is hidden (names starting with '.' are never served)")
    try:
        resolved = confine(path, root)
    except MMAgentError:
        raise _refuse(path, "resolves outside the workspace") from None
    if not resolved.is_relative_to(
        root
    ):  # an allowed root is for tool arguments; resources serve the workspace
        raise _refuse(path, "resolves outside the workspace")
    if any(p.startswith(".") for p in resolved.relative_to(root).parts):
        raise _refuse(path, "resolves to a hidden file")
    return resolved


def _job_dir_of(resolved: Path, root: Path) -> Path | None:
    """The nearest directory from `resolved` up to the workspace root that holds a job.yaml."""
    start = resolved if resolved.is_dir() else resolved.parent
    for d in (start, *start.parents):
        if (d / JOB_FILE).is_file():
            return d
        if d == root:
            break
    return None


def _as_text(data: bytes) -> str | None:
    """UTF-8 text without NUL bytes, else None: binary files (features, weights) are never served."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def read_job_file(path: str, root: Path) -> JobFileText:
    """`mm-agent://jobs/{+path}`: a text file of a rendered job, or the index of a job directory."""
    root = root.resolve()
    resolved = _resolve_in_workspace(path, root)
    if not resolved.exists():
        raise _refuse(path, "does not exist")
    job_dir = _job_dir_of(resolved, root)
    if job_dir is None:
        raise _refuse(path, "is not inside a rendered job (no job.yaml in it or above it)")
    job_rel = job_dir.relative_to(root).as_posix()
    rel = resolved.relative_to(root).as_posix()
    if resolved.is_dir():
        if resolved != job_dir:
            raise _refuse(path, "is a directory inside a job; read the job directory or one of its files")
        files = [ref.model_dump() for ref in _job_files(job_dir, root)]
        index = {"job_dir": job_rel, "files": files}
        return JobFileText(job_dir=job_rel, path=rel, text=json.dumps(index, indent=2))
    if not resolved.is_file():
        raise _refuse(path, "is not a regular file")
    size = resolved.stat().st_size
    if size > MAX_FILE_BYTES:
        raise MMAgentError(
            f"job file {rel!r} is {size} bytes, over the {MAX_FILE_BYTES}-byte limit for resources",
            field="path",
            fix="read large logs with tail_logs or diagnose_errors instead",
        )
    # Opened by `read_file`: a parent swapped for a symlink since the checks above is caught at the open.
    text = _as_text(read_file(resolved, root, field="path", limit=MAX_FILE_BYTES))
    if text is None:
        raise MMAgentError(
            f"job file {rel!r} is not UTF-8 text", field="path", fix="only text files are served"
        )
    return JobFileText(job_dir=job_rel, path=rel, text=text)


def _job_files(job_dir: Path, root: Path) -> list[JobFileRef]:
    """The listable files of one job: text-like suffixes, at most one directory deep, no hidden names."""
    job_rel = job_dir.relative_to(root).as_posix()
    found: list[JobFileRef] = []
    candidates = sorted(job_dir.iterdir()) + sorted(
        p for d in sorted(job_dir.iterdir()) if d.is_dir() and not d.is_symlink() for p in d.iterdir()
    )
    for p in candidates:
        rel_in_job = p.relative_to(job_dir)
        if any(part.startswith(".") for part in rel_in_job.parts) or p.suffix not in LISTED_SUFFIXES:
            continue
        if not is_utf8(str(rel_in_job)):
            continue  # a name that is not UTF-8 has no URI that reads it back (and render writes none)
        if p.is_symlink() or not p.is_file():
            continue
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            continue
        rel = p.relative_to(root).as_posix()
        found.append(JobFileRef(uri=job_uri(rel), job_dir=job_rel, path=rel, bytes=size))
        if len(found) >= MAX_LISTED_FILES_PER_JOB:
            break
    return found


def find_jobs(root: Path) -> list[Path]:
    """Rendered job directories under the workspace (bounded walk; a job's own subfolders are not
    searched, and neither are hidden folders or symlinks)."""
    root = root.resolve()
    jobs: list[Path] = []
    for scanned, (current, dirs, files) in enumerate(os.walk(root), start=1):
        cancel.check()  # an abandoned resources/list stops walking here
        here = Path(current)
        depth = len(here.relative_to(root).parts)
        if JOB_FILE in files:
            if is_utf8(str(here.relative_to(root))):  # (a folder name that is not UTF-8 has no URI)
                jobs.append(here)
            dirs.clear()
        elif depth >= JOB_SEARCH_DEPTH:
            dirs.clear()
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (here / d).is_symlink())
        if len(jobs) >= MAX_LISTED_JOBS or scanned >= MAX_DIRS_SCANNED:
            break
    return jobs


def list_job_files(root: Path) -> list[JobFileRef]:
    """Every listable file of every rendered job in the workspace, for resources/list."""
    root = root.resolve()
    return [ref for job in find_jobs(root) for ref in _job_files(job, root)]


def list_skills() -> list[str]:
    """Names of the generated skills present in `skills_dir()` (`MM_AGENT_SKILLS` overrides; none when
    the checkout has no skills/ yet)."""
    base = skills_dir()
    if not base.is_dir():
        return []
    return sorted(d.name for d in base.iterdir() if NAME_RE.match(d.name) and (d / SKILL_MD).is_file())


def read_skill(name: str, reference: str | None = None) -> str:
    """`mm-agent://skills/{name}` (SKILL.md) or `.../references/{file}`: shipped files, not the workspace."""
    if not NAME_RE.match(name):
        raise UnknownResource(
            f"invalid skill name {name!r}", field="name", fix="use a name from resources/list"
        )
    if reference is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.md$", reference):
        raise UnknownResource(
            f"invalid reference file {reference!r}", field="file", fix="use a file name linked from SKILL.md"
        )
    rel = f"{name}/references/{reference}" if reference else f"{name}/{SKILL_MD}"
    base = skills_dir().resolve()
    target = (base / rel).resolve()
    if not target.is_relative_to(base) or not target.is_file():
        known = ", ".join(list_skills()) or "none (run `mm-agent skills build`)"
        raise UnknownResource(f"no skill file {rel}", field="name", fix=f"generated skills: {known}")
    return target.read_text(encoding="utf-8")


# the Agent Skills discovery index schema that the extension's index mirrors (url: the skill:// URI; no digest:
# the connection carries integrity; type: always skill-md, since every file is its own resource)
SKILL_INDEX_SCHEMA = "https://schemas.agentskills.io/discovery/0.2.0/schema.json"


def skill_uri(name: str, reference: str | None = None) -> str:
    """The `skill://` URI of a skill's SKILL.md, or of one of its reference files."""
    return f"{SKILL_SCHEME}{name}/references/{reference}" if reference else f"{SKILL_SCHEME}{name}/{SKILL_MD}"


def _skill_description(name: str) -> str:
    """The `description` of a skill's SKILL.md frontmatter (what a host shows to pick a skill)."""
    text = read_skill(name)
    parts = text.split("---", 2) if text.startswith("---\n") else []
    data = yaml.safe_load(parts[1]) if len(parts) == 3 else None
    description = data.get("description") if isinstance(data, dict) else None
    if not isinstance(description, str) or not description:
        raise MMAgentError(
            f"skill {name} has no description in its SKILL.md frontmatter",
            file=f"{name}/{SKILL_MD}",
            field="description",
            fix="rebuild the skills: mm-agent skills build",
        )
    return description


def skill_index() -> str:
    """`skill://index.json`: every generated skill with its description and SKILL.md URI."""
    entries = [
        {"name": n, "type": "skill-md", "description": _skill_description(n), "url": skill_uri(n)}
        for n in list_skills()
    ]
    return json.dumps({"$schema": SKILL_INDEX_SCHEMA, "skills": entries}, indent=2, ensure_ascii=False)
