"""Argument completion (MCP `completion/complete`) for mm-agent's prompts and resource templates.

A host offers these values while a user fills in a prompt or a resource URI, so each one must be something
the server then accepts: registry model ids, generated skill names and their reference files, rendered job
files of this workspace, this workspace's run ids, the new-model bases. Free-text and path arguments get no
suggestions (an empty list, as the protocol allows). A prompt, template or argument that mm-agent does not
have is an error naming what it has (the protocol's invalid-params, as for prompts/get), not an empty list
that would look like "nothing matches".
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mm_agent import resources
from mm_agent.errors import MMAgentError

MAX_VALUES = 100  # the protocol's cap on values in one completion answer


class Completed(BaseModel):
    """The values that start with what the user typed, at most `MAX_VALUES`, and how many matched."""

    model_config = ConfigDict(extra="forbid")

    values: list[str] = Field(max_length=MAX_VALUES)
    total: int
    has_more: bool


def _model_ids(_: Mapping[str, str], root: Path) -> list[str]:
    return [m.id for m in resources.model_catalog().models]


def _skill_names(_: Mapping[str, str], root: Path) -> list[str]:
    return resources.list_skills()


def _skill_files(given: Mapping[str, str], root: Path) -> list[str]:
    """The reference files of the skill already named in the URI (none until the name is filled in)."""
    name = given.get("name", "")
    if name not in resources.list_skills():
        return []
    folder = resources.skills_dir() / name / "references"
    return sorted(p.name for p in folder.glob("*.md") if p.is_file()) if folder.is_dir() else []


def _job_paths(_: Mapping[str, str], root: Path) -> list[str]:
    return [ref.path for ref in resources.list_job_files(root)]


def _run_ids(_: Mapping[str, str], root: Path) -> list[str]:
    """This workspace's runs only: the server neither reads nor stops another workspace's (runs.check_owner)."""
    from mm_agent.runs import RUN_ID_PATTERN, check_owner, read_meta, runs_dir

    run_id = re.compile(RUN_ID_PATTERN)
    base = runs_dir()
    found: list[str] = []
    if base.is_dir():
        for path in sorted(base.iterdir(), reverse=True):
            if not run_id.match(path.name):
                continue
            with contextlib.suppress(MMAgentError, OSError):
                check_owner(read_meta(path), root)
                found.append(path.name)
    return found


def _bases(_: Mapping[str, str], root: Path) -> list[str]:
    from mm_agent.scaffold.spec import load_spec  # (registry data only)

    return [b.id for b in load_spec().bases]


def _none(_: Mapping[str, str], root: Path) -> list[str]:
    return []


Source = Callable[[Mapping[str, str], Path], list[str]]
# argument -> where its values come from, per prompt and per resource template
PROMPTS: dict[str, dict[str, Source]] = {
    "finetune_generative": {"request": _none, "dataset_dir": _none, "weights_dir": _none},
    "finetune_vlm": {"request": _none, "dataset_file": _none},
    "new_model": {"request": _none, "name": _none, "checkout": _none, "base": _bases},
    "recover_failed_run": {"log_path": _none, "run_id": _run_ids},
}
TEMPLATES: dict[str, dict[str, Source]] = {
    "mm-agent://models/{model_id}": {"model_id": _model_ids},
    "mm-agent://jobs/{+path}": {"path": _job_paths},
    "mm-agent://skills/{name}": {"name": _skill_names},
    "mm-agent://skills/{name}/references/{file}": {"name": _skill_names, "file": _skill_files},
    "skill://{name}/SKILL.md": {"name": _skill_names},
    "skill://{name}/references/{file}": {"name": _skill_names, "file": _skill_files},
}


def _matching(candidates: Iterable[str], typed: str) -> Completed:
    """Prefix matches first, then other values containing what was typed (case-insensitive)."""
    low = typed.lower()
    values = list(dict.fromkeys(candidates))
    ranked = [v for v in values if v.lower().startswith(low)] + [
        v for v in values if low in v.lower() and not v.lower().startswith(low)
    ]
    return Completed(values=ranked[:MAX_VALUES], total=len(ranked), has_more=len(ranked) > MAX_VALUES)


def complete(
    kind: str, name: str, argument: str, value: str, given: Mapping[str, str], root: Path
) -> Completed:
    """Values for `argument` of prompt `name` (kind "prompt") or resource template `name` (kind "resource"),
    starting with `value`; `given` holds the arguments already filled in (the skill whose files to offer)."""
    table, what = (PROMPTS, "prompt") if kind == "prompt" else (TEMPLATES, "resource template")
    if name not in table:
        raise MMAgentError(
            f"unknown {what} {name!r}",
            field="ref",
            fix=f"complete an argument of one of: {', '.join(sorted(table))}",
        )
    sources = table[name]
    if argument not in sources:
        raise MMAgentError(
            f"{what} {name} has no argument {argument!r}",
            field="argument",
            fix=f"it takes: {', '.join(sources)}",
        )
    return _matching(sources[argument](given, root), value)
