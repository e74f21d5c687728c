"""What the skill templates see: the registry, the workflows, the real MCP tool list, the diagnose catalog.

Everything a skill states about models, tools or failures comes from here, so a skill cannot drift from
the code: a renamed tool, a new model or a changed fix shows up as a `mm-agent skills build --check`
difference. The context is deterministic (sorted, no clock, no machine state) so that two builds of the
same tree are byte-identical and the committed skills can be compared with a fresh build.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from mm_agent.registry import Registry, shipped_registry
from mm_agent.registry.schema import ModelEntry


class ToolInfo(BaseModel):
    """One MCP tool as the server registers it (the skills name tools exactly as clients see them)."""

    name: str
    title: str
    description: str = Field(description="the tool's description, whitespace collapsed to one paragraph")
    mutating: bool = Field(description="not read-only: the skill must dry-run it and confirm with the user")


class SignatureInfo(BaseModel):
    """One failure signature of the diagnose catalog, reduced to what a troubleshooting table shows."""

    id: str
    category: str
    title: str
    stage: str
    effect: str
    cause: str
    fixes: list[str] = Field(description="fix texts, lightest first")
    env_vars: list[str]


def _first_sentence(text: str) -> str:
    """What a tool does, in the words of its description (tools carry no display title: every client would
    read it in context)."""
    text = " ".join(text.split())
    head, dot, _ = text.partition(". ")
    return head.rstrip(".") if dot else text.rstrip(".")


def list_tools() -> list[ToolInfo]:
    """The tools of a real `build_server` instance, listed in-process (no client, no network, no torch).

    Called from synchronous code only: it runs its own event loop."""
    from mm_agent.server import build_server  # the server is import-heavy; only the build needs it

    server = build_server(Path.cwd())
    tools = anyio.run(server.list_tools)
    return sorted(
        (
            ToolInfo(
                name=t.name,
                title=t.title or _first_sentence(t.description or t.name),
                description=" ".join((t.description or "").split()),
                mutating=not (t.annotations is not None and t.annotations.read_only_hint),
            )
            for t in tools
        ),
        key=lambda t: t.name,
    )


def list_signatures() -> list[SignatureInfo]:
    from mm_agent.diagnose.catalog import get_catalog

    return [
        SignatureInfo(
            id=c.sig.id,
            category=c.sig.category,
            title=c.sig.title,
            stage=c.sig.stage,
            effect=c.sig.effect,
            cause=" ".join(c.sig.cause.split()),
            fixes=[" ".join(f.text.split()) for f in c.sig.fixes],
            env_vars=list(c.sig.env_vars),
        )
        for c in sorted(get_catalog(), key=lambda c: c.sig.id)
    ]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value)
    return " ".join(str(value).split()).replace("|", "\\|")


def md_table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    """A GitHub-flavoured Markdown table; `|` in cells is escaped and newlines are folded, so registry
    text can never break the table. Lists become comma-separated, None an empty cell, bools yes/no."""
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = list(row)
        if len(cells) != len(headers):
            raise ValueError(f"md_table: row has {len(cells)} cells, headers have {len(headers)}: {cells!r}")
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def helpers(registry: Registry) -> dict[str, Callable[..., Any]]:
    """Functions the templates use both as globals (`models_by_family("vlm")`) and as filters
    (`"vlm" | models_by_family`)."""

    def models_by_family(family: str) -> list[ModelEntry]:
        return sorted((m for m in registry.models.values() if m.family == family), key=lambda m: m.id)

    def models_for_version(version: str) -> list[ModelEntry]:
        registry.check_version(version)
        return sorted(
            (m for m in registry.models.values() if m.versions.contains(version)), key=lambda m: m.id
        )

    def model_steps(model_id: str) -> list[dict[str, Any]]:
        """The model's cited steps (registry/data/steps/) for each task at the newest version its steps
        data covers: [{task, version, steps: [StepView]}] with the README's own paths (ckpt/hf_path/...)."""
        from mm_agent.registry.steps import has_steps
        from mm_agent.stepplan import pipeline_context, views  # (the skills build only)

        entry = registry.models[model_id]
        out: list[dict[str, Any]] = []
        for task in entry.tasks:
            known = [v for v in registry.versions.ids if v != "master" and has_steps(entry, v)]
            version = next((v for v in reversed(known) if task.versions.contains(v)), None)
            if version is None:
                continue
            size = next(s for s in entry.sizes if task.sizes is None or s.id in task.sizes)
            label = (
                task.id if sum(t.id == task.id for t in entry.tasks) == 1 else f"{task.id} ({task.backend})"
            )
            out.append(
                {
                    "task": label,
                    "size": size.id,
                    "version": version,
                    "steps": views(pipeline_context(entry, task, size, version)),
                }
            )
        return out

    return {
        "md_table": md_table,
        "models_by_family": models_by_family,
        "models_for_version": models_for_version,
        "model_steps": model_steps,
        "words": words,
    }


def words(items: Iterable[Any]) -> str:
    """`a`, `a and b`, `a, b and c`: a list as a sentence reads it."""
    parts = [str(i) for i in items]
    return " and ".join(parts) if len(parts) < 3 else ", ".join(parts[:-1]) + " and " + parts[-1]


def bundled_tasks(registry: Registry) -> list[str]:
    """The "model task" pairs the bundled runtime trains (a size accepted by `jobspec.bundled_refusal`), so
    the skills say what `runtime=bundled` runs exactly as render_job decides it."""
    from mm_agent.jobspec import bundled_refusal

    return sorted(
        {
            f"{m.id} {t.id}"
            for m in registry.models.values()
            for t in m.tasks
            if any(bundled_refusal(m, t, s) is None for s in m.sizes)
        }
    )


def skill_context() -> dict[str, Any]:
    """The template context (contract K2): registry, default_version, workflows, tools, signatures, cli,
    native, launchers, rehearsal, new_model, new_model_bases, bundled.

    `cli` maps a tool name to the CLI command of its first workflow step (scenario order), the command an
    assistant without MCP, or a person, types instead of the tool call. `native` maps each converter that
    `convert_weights` runs itself to its methods, so the skills cannot drift from `mm_agent.convert`;
    `launchers` maps each render_job launcher to the file it writes. `rehearsal` is route_model's
    vocabulary of "try it on this machine first" (its words and the demo of each model and task);
    `new_model` its vocabulary of "add my own model" (words, default base, demo) and `new_model_bases` the
    bases the scaffold starts from; `bundled` lists the "model task" pairs runtime=bundled trains."""
    from mm_agent.convert.plan import NATIVE
    from mm_agent.jobspec import LAUNCHER_FILES
    from mm_agent.route import load_vocabulary
    from mm_agent.scaffold.spec import load_spec
    from mm_agent.skills.workflows import load_workflows

    registry = shipped_registry()  # the skills describe what ships, never one workspace's own models
    workflows = load_workflows()
    return {
        "registry": registry,
        "default_version": registry.versions.default,
        "workflows": workflows,
        "tools": list_tools(),
        "signatures": list_signatures(),
        "cli": workflows.cli_for_tools(),
        "native": {conv: sorted(methods) for conv, methods in NATIVE.items()},
        "launchers": dict(LAUNCHER_FILES),
        "rehearsal": load_vocabulary().rehearsal,
        "new_model": load_vocabulary().new_model,
        "new_model_bases": [b.id for b in load_spec().bases],
        "bundled": bundled_tasks(registry),
    }
