"""`mm-agent skills install`: copy the built skills to where an assistant loads them.

A dry run by default (it says, per skill, what would happen). With `confirm` each skill is copied into a
temp dir next to its destination and renamed into place. A destination that holds a different skill of
the same name is the user's (perhaps edited) copy: it is refused unless `force`, and then moved to
`<target>/.mm-agent-backups/<name>.bak-<UTC time>` — a hidden folder, so the host does not load the old
copy as a second skill. Identical destinations are left alone (`unchanged`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from mm_agent.errors import MMAgentError
from mm_agent.skills.build import SKILL_MD, skills_dir

DEFAULT_TARGET = "~/.claude/skills"
BACKUPS = ".mm-agent-backups"

InstallStatus = Literal["would_install", "would_replace", "conflict", "unchanged", "installed", "replaced"]


class InstallSkillsRequest(BaseModel):
    target: str = Field(
        default=DEFAULT_TARGET,
        description="skills folder of the host: ~/.claude/skills (Claude Code, personal), .claude/skills "
        "(Claude Code, this project), ~/.agents/skills or .agents/skills (hosts that read the shared "
        "Agent Skills folder)",
    )
    source: str | None = Field(default=None, description="built skills folder (default: <checkout>/skills)")
    force: bool = Field(
        default=False, description="replace a different skill of the same name (kept as backup)"
    )
    confirm: bool = Field(default=False, description="copy; false = dry run that only reports")


class InstalledSkill(BaseModel):
    name: str
    status: InstallStatus = Field(
        description="dry run: would_install | would_replace (force) | conflict (different; needs force) | "
        "unchanged; confirmed: installed | replaced | unchanged"
    )
    path: str = Field(description="the skill's folder under the target")
    backup_dir: str | None = Field(default=None, description="where the replaced copy was moved")


class InstallSkillsResult(BaseModel):
    source: str
    target: str
    dry_run: bool
    skills: list[InstalledSkill]


def _tree(folder: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            path = Path(dirpath, name)
            files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return files


def source_skills(source: Path) -> list[str]:
    """Skill folders in `source`: not hidden, with a SKILL.md."""
    if not source.is_dir():
        raise MMAgentError(
            "skills folder not found",
            file=str(source),
            fix="run `mm-agent skills build` in the mm-agent checkout, or pass --source DIR",
        )
    names = sorted(
        p.name for p in source.iterdir() if not p.name.startswith(".") and (p / SKILL_MD).is_file()
    )
    if not names:
        raise MMAgentError(
            "no skills (folders with a SKILL.md) found",
            file=str(source),
            fix="run `mm-agent skills build` first, or pass the folder that holds the skills as --source",
        )
    return names


def _backup_path(target: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = target / BACKUPS / f"{name}.bak-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _copy_in(src: Path, target: Path, name: str) -> str | None:
    """Copy `src` to `target/name` via a temp dir + rename; an existing one is moved to a backup first.
    Returns the backup path."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target))
    try:
        shutil.copytree(src, tmp / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    dest = target / name
    backup: Path | None = None
    if dest.exists() or dest.is_symlink():
        backup = _backup_path(target, name)
        backup.parent.mkdir(parents=True, exist_ok=True)
        dest.rename(backup)
    try:
        (tmp / name).rename(dest)
    except BaseException:
        if backup is not None:
            backup.rename(dest)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(backup) if backup else None


def install_skills(req: InstallSkillsRequest) -> InstallSkillsResult:
    """Plan every skill first; a conflict without `force` refuses the whole install before any copy."""
    source = (Path(req.source).expanduser() if req.source else skills_dir()).resolve()
    target = Path(req.target).expanduser().resolve()
    names = source_skills(source)
    if target == source:
        raise MMAgentError("target is the source folder", file=str(target), fix="pass another --target")
    if target.exists() and not target.is_dir():
        raise MMAgentError("target exists and is not a folder", file=str(target), fix="pass another --target")
    planned: list[InstalledSkill] = []
    for name in names:
        dest = target / name
        if not dest.exists() and not dest.is_symlink():
            status: InstallStatus = "would_install"
        elif dest.is_dir() and not dest.is_symlink() and _tree(dest) == _tree(source / name):
            status = "unchanged"
        else:
            status = "would_replace" if req.force else "conflict"
        planned.append(InstalledSkill(name=name, status=status, path=str(dest)))
    conflicts = [s for s in planned if s.status == "conflict"]
    if req.confirm and conflicts:
        raise MMAgentError(
            f"installed skill(s) differ from the new ones: {', '.join(s.name for s in conflicts)}",
            file=conflicts[0].path,
            fix="compare them with the new skills; pass --force to replace them (each old one is kept in "
            f"{target / BACKUPS})",
        )
    if req.confirm:
        target.mkdir(parents=True, exist_ok=True)
        for skill in planned:
            if skill.status == "unchanged":
                continue
            skill.backup_dir = _copy_in(source / skill.name, target, skill.name)
            skill.status = "replaced" if skill.backup_dir else "installed"
    return InstallSkillsResult(
        source=str(source), target=str(target), dry_run=not req.confirm, skills=planned
    )
