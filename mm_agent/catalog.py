"""`list_models`: the registry as a filterable catalog (what `mm-agent models` and the MCP tool return)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from mm_agent.fields import Name
from mm_agent.registry import get_registry
from mm_agent.registry.schema import Backend, Family


class ListModelsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    family: Family | None = None
    task: Name | None = Field(default=None, description="only models with this task, e.g. t2v, sft, dpo")
    backend: Backend | None = Field(default=None, description="only models with a task on this backend")
    mm_version: Name | None = Field(
        default=None, description="mark availability for this MindSpeed-MM version"
    )
    include_unavailable: bool = Field(default=True, description="also list models absent from mm_version")


class TaskSummary(BaseModel):
    task: str
    backend: str
    entry_script: str
    needs_feature_extraction: bool
    available_in_version: bool


class ModelSummary(BaseModel):
    id: str
    name: str
    family: str
    status: str
    sizes: list[str]
    tasks: list[TaskSummary]
    converter: str | None
    skill: str
    versions: str = Field(description="MindSpeed-MM versions that ship the model")
    available_in_version: bool


class ModelList(BaseModel):
    mm_version: str
    count: int
    models: list[ModelSummary]


def list_models(req: ListModelsRequest) -> ModelList:
    reg = get_registry()
    version = reg.check_version(req.mm_version or reg.versions.default)
    out: list[ModelSummary] = []
    for entry in sorted(reg.models.values(), key=lambda e: (e.family, e.id)):
        if req.family and entry.family != req.family:
            continue
        tasks = [
            t
            for t in entry.tasks
            if (not req.task or t.id == req.task) and (not req.backend or t.backend == req.backend)
        ]
        if not tasks:
            continue
        available = entry.versions.contains(version)
        if not available and not req.include_unavailable:
            continue
        out.append(
            ModelSummary(
                id=entry.id,
                name=entry.name,
                family=entry.family,
                status=entry.status,
                sizes=[s.id for s in entry.sizes],
                tasks=[
                    TaskSummary(
                        task=t.id,
                        backend=t.backend,
                        entry_script=t.entry_script.path,
                        needs_feature_extraction=t.feature_extraction is not None,
                        available_in_version=available
                        and t.versions.contains(version)
                        and t.entry_script.versions.contains(version),
                    )
                    for t in tasks
                ],
                converter=entry.converter.class_name if entry.converter else None,
                skill=entry.skill,
                versions=entry.versions.describe(),
                available_in_version=available,
            )
        )
    return ModelList(mm_version=version, count=len(out), models=out)
