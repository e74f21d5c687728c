"""`install_deps` planning: (model, MindSpeed-MM version, arch) -> an ordered, verified list of argv steps.

Every package name, version, URL and flag comes from the registry and `install.yaml` (see steps.py); the
request only picks among them and names local paths, which are confined to the workspace over MCP.
"""

from __future__ import annotations

import platform
import shlex
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from mm_agent.errors import MMAgentError
from mm_agent.fields import MAX_ITEMS, NAME_CHARS, PathText
from mm_agent.install.conflicts import Conflict, find_conflicts
from mm_agent.install.schema import Arch, OsFamily
from mm_agent.install.steps import EnvKind, Layout, PlanStep, build_steps, plan_context
from mm_agent.paths import confine
from mm_agent.registry import Registry, get_registry
from mm_agent.registry.schema import ModelEntry

# Model ids, aliases and HF ids: letters (any script), digits, `._-/` and spaces; nothing a shell reads.
# (The length is `max_length`'s: a bounded repeat of the Unicode `\w` costs pydantic-core's regex ~30 ms to build.)
MODEL_NAME = r"^[\w][\w./ -]*$"
STEP_ID = r"^[a-z0-9][a-z0-9.-]{0,63}$"
ModelName = Annotated[str, StringConstraints(max_length=100, pattern=MODEL_NAME)]
StepId = Annotated[str, StringConstraints(max_length=64, pattern=STEP_ID)]
# A non-empty `PathText` (one line, no control character: the paths end up in install.sh). The length
# check comes first so an empty path is reported as too short.
InstallPath = Annotated[(str, StringConstraints(min_length=1), *PathText.__metadata__)]


class InstallRequest(BaseModel):
    """What to install. Only choices and local paths: packages, versions and URLs come from the registry."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = Field(description="registry id or alias")
    mm_version: str | None = Field(
        default=None,
        max_length=NAME_CHARS,
        pattern=r"^(master|\d+\.\d+\.\d+)$",
        description="default: the registry's",
    )
    arch: Arch | None = Field(default=None, description="default: this machine's")
    os_family: OsFamily | None = Field(
        default=None,
        description="default: this machine's",
    )
    env: EnvKind = "venv"
    env_path: InstallPath | None = Field(default=None, description="default: envs/<model>-<version>")
    mm_root: InstallPath = Field(default="MindSpeed-MM", description="MindSpeed-MM checkout folder")
    src_dir: InstallPath | None = Field(
        default=None, description="Megatron-LM/decord checkouts; default: mm_root's parent"
    )
    python: str | None = Field(
        default=None,
        max_length=5,
        pattern=r"^3\.\d{1,2}$",
        description="default: 3.10 (the version matrix's)",
    )
    also_models: list[ModelName] = Field(
        default_factory=list, max_length=20, description="other models meant to share this environment"
    )
    steps: list[StepId] | None = Field(
        default=None, max_length=MAX_ITEMS, description="run only these step ids (default: all)"
    )
    confirm: bool = Field(default=False, description="install (false: dry run, the plan)")


class InstallPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    also_models: list[str]
    mm_version: str
    arch: Arch
    os_family: OsFamily
    env: EnvKind
    env_path: str
    python: str
    mm_root: str
    src_dir: str
    steps: list[PlanStep]
    conflicts: list[Conflict]
    upstream: list[str] = Field(
        description="the model README's own install lines, for reference (the steps do the same, pinned)"
    )
    notes: list[str]
    script: str = Field(
        default="", description="the plan as a bash script (set -euo pipefail, verified steps)"
    )


# ------------------------------------------------------------------------------------------- host facts


def host_arch() -> Arch:
    machine = platform.machine().lower()
    if machine in {"x86_64", "amd64"}:
        return "x86_64"
    if machine in {"aarch64", "arm64"}:
        return "aarch64"
    raise MMAgentError(
        f"unsupported CPU architecture {machine!r}",
        field="arch",
        fix="pass arch x86_64 or aarch64 explicitly",
    )


def host_os_family(os_release: Path = Path("/etc/os-release")) -> OsFamily:
    """debian for Debian/Ubuntu, rhel for openEuler/CentOS/RHEL/Kylin (what MindSpeed-MM's Dockerfile targets)."""
    try:
        text = os_release.read_text(encoding="utf-8", errors="replace").lower()
    except OSError:
        text = ""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    words = " ".join(fields.get(k, "").strip('"') for k in ("id", "id_like")).split()
    if any(w in {"rhel", "centos", "fedora", "openeuler", "euleros", "kylin"} for w in words):
        return "rhel"
    return "debian"


# ------------------------------------------------------------------------------------------- requests


def resolve_model(name: str, reg: Registry) -> ModelEntry:
    """A registry id, display name or alias (case-insensitive); unknown names get a did-you-mean."""
    if name in reg.models:
        return reg.models[name]
    folded = name.strip().lower()
    for entry in reg.models.values():
        if folded in {entry.id.lower(), entry.name.lower(), *(a.lower() for a in entry.aliases)}:
            return entry
    return reg.get(name)


def model_at_version(entry: ModelEntry, version: str, reg: Registry) -> None:
    """Refuse a version without the model, naming the versions that have it."""
    if not entry.versions.contains(version):
        have = [v for v in reg.versions.ids if entry.versions.contains(v)]
        raise MMAgentError(
            f"{entry.id} is not in MindSpeed-MM {version}; it exists in {', '.join(have) or 'no release'}",
            field="mm_version",
            fix=f"use mm_version {have[-1]}" if have else "pick another model (mm-agent models)",
        )


def _path(value: str, base: Path, root: Path | None) -> str:
    return str(confine(value, root) if root else (base / Path(value).expanduser()).resolve())


def build_plan(
    req: InstallRequest, *, root: Path | None = None, registry: Registry | None = None
) -> InstallPlan:
    """The full plan for `req` (nothing is run). `root` confines every path (the MCP workspace)."""
    from mm_agent.install.script import render_script

    reg = registry or get_registry()
    entry = resolve_model(req.model, reg)
    version = reg.check_version(req.mm_version or reg.versions.default)
    info = reg.versions.get(version)
    assert info is not None  # check_version guarantees it
    also = [resolve_model(name, reg) for name in req.also_models]
    for model in (entry, *also):
        model_at_version(model, version, reg)

    base = (root or Path.cwd()).resolve()
    mm_root = _path(req.mm_root, base, root)
    src_dir = _path(req.src_dir, base, root) if req.src_dir else str(Path(mm_root).parent)
    if root is not None and not Path(src_dir).is_relative_to(root.resolve()):
        raise MMAgentError(
            f"src_dir defaults to mm_root's parent {src_dir}, which is outside the workspace",
            field="src_dir",
            fix="pass src_dir (a folder inside the workspace for the Megatron-LM and decord checkouts)",
        )
    env_path = _path(req.env_path or f"envs/{entry.id}-{version}", base, root)
    arch = req.arch or host_arch()
    os_family = req.os_family or host_os_family()
    ctx = plan_context(
        entry,
        info,
        Layout.for_env(mm_root, src_dir, env_path),
        arch=arch,
        os_family=os_family,
        env=req.env,
        python=req.python,
        registry=reg,
    )
    steps = build_steps(ctx)
    if req.steps is not None:
        known = [s.id for s in steps]
        unknown = [s for s in req.steps if s not in known]
        if unknown:
            raise MMAgentError(
                f"unknown step id(s) {', '.join(unknown)}",
                field="steps",
                fix=f"use some of: {', '.join(known)}",
            )

    notes: list[str] = []
    if ctx.python != info.python:
        notes.append(
            f"MindSpeed-MM {version} is tested with Python {info.python}; this plan uses {ctx.python}."
        )
    if ctx.overlay is not None:
        notes += ctx.overlay.notes
    notes += entry.conflicts
    upstream: list[str] = []
    if ctx.overlay is not None and ctx.overlay.install_sh is not None:
        upstream.append(shlex.join(["bash", ctx.knowledge.install_sh.path, *ctx.overlay.install_sh]))
        notes += ctx.knowledge.install_sh.notes
    conflicts = find_conflicts([entry, *also], info, ctx.knowledge)
    if any(c.kind == "cross_model" for c in conflicts):
        notes.append("Cross-model conflicts found: install these models into separate environments.")
    plan = InstallPlan(
        model=entry.id,
        also_models=[e.id for e in also],
        mm_version=version,
        arch=arch,
        os_family=os_family,
        env=req.env,
        env_path=env_path,
        python=ctx.python,
        mm_root=mm_root,
        src_dir=src_dir,
        steps=steps,
        conflicts=conflicts,
        upstream=upstream,
        notes=notes,
    )
    return plan.model_copy(update={"script": render_script(plan, selected=req.steps)})
