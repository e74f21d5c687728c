"""Model registry: validated data files, loaded once, behind a few accessors.

Data lives in `registry/data/models/<id>.yaml` (one MindSpeed-MM examples/ directory each) and
`registry/data/versions.yaml`. A malformed file fails loudly with the file and the field path.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from mm_agent.errors import MMAgentError
from mm_agent.registry.schema import ModelEntry, UnregisteredExample, UnregisteredExamples, VersionTable
from mm_agent.workspace import served_workspace

DATA_DIR = Path(__file__).with_name("data")
M = TypeVar("M", bound=BaseModel)


# libyaml's loader is ~10x faster than the pure-Python one (103 catalog files: 0.35 s -> 0.03 s).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> object:
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as exc:
        raise MMAgentError(f"invalid YAML: {exc}", file=str(path), fix="fix the YAML syntax") from exc


def validation_error(
    path: Path, exc: ValidationError, schema: str = "mm_agent/registry/schema.py"
) -> MMAgentError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "<root>"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return MMAgentError(
        f"{first['msg']}{more}",
        file=str(path),
        field=field,
        fix=f"correct the field to match {schema}",
    )


def load_data(model: type[M], path: Path, schema: str = "mm_agent/registry/schema.py") -> M:
    """A data file validated by its pydantic model; a malformed one is an error naming the file, the field
    and the module that defines its schema."""
    try:
        return model.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise validation_error(path, exc, schema=schema) from exc


def load_models(data_dir: Path | None = None) -> dict[str, ModelEntry]:
    """Load and validate every model file; ids must equal file stems and be unique."""
    models_dir = (data_dir or DATA_DIR) / "models"
    files = sorted(models_dir.glob("*.yaml"))
    if not files:
        raise MMAgentError("no model files found", file=str(models_dir), fix="reinstall mm-agent")
    models: dict[str, ModelEntry] = {}
    for path in files:
        raw = read_yaml(path)
        try:
            entry = ModelEntry.model_validate(raw)
        except ValidationError as exc:
            raise validation_error(path, exc) from exc
        if entry.id != path.stem:
            raise MMAgentError(
                f"id {entry.id!r} differs from the file name",
                file=str(path),
                field="id",
                fix=f"rename the file to {entry.id}.yaml or set id: {path.stem}",
            )
        models[entry.id] = entry
    return models


def load_versions(data_dir: Path | None = None) -> VersionTable:
    return load_data(VersionTable, (data_dir or DATA_DIR) / "versions.yaml")


def load_unregistered_examples(data_dir: Path | None = None) -> list[UnregisteredExample]:
    """The `examples/` directories that deliberately have no model file (unregistered_examples.yaml)."""
    path = (data_dir or DATA_DIR) / "unregistered_examples.yaml"
    table = load_data(UnregisteredExamples, path)
    known = set(load_versions(data_dir).ids)
    for i, item in enumerate(table.dirs):
        for v in (item.versions.since, item.versions.until):
            if v is not None and v not in known:
                raise MMAgentError(
                    f"unknown MindSpeed-MM version {v!r}",
                    file=str(path),
                    field=f"dirs.{i}.versions",
                    fix=f"use one of {sorted(known)}",
                )
    return table.dirs


class Registry:
    """Loaded registry: models by id plus the MindSpeed-MM version table."""

    def __init__(self, models: dict[str, ModelEntry], versions: VersionTable):
        self.models = models
        self.versions = versions
        self._check_cross_references()

    def _check_cross_references(self) -> None:
        known = set(self.versions.ids)
        for entry in self.models.values():
            ranges = [entry.versions, *(t.versions for t in entry.tasks), *(d.versions for d in entry.deps)]
            ranges += [s.versions for s in entry.sizes]
            ranges += [rng for s in entry.sizes for rng in s.config_file_versions.values()]
            for conv in (entry.converter, *(t.converter for t in entry.tasks)):
                if conv is not None:
                    ranges += [conv.versions, *conv.method_versions.values()]
            for rng in ranges:
                for v in (rng.since, rng.until):
                    if v is not None and v not in known and v != "1.0.0":
                        raise MMAgentError(
                            f"unknown MindSpeed-MM version {v!r}",
                            file=f"models/{entry.id}.yaml",
                            field="versions",
                            fix=f"use one of {sorted(known)}",
                        )

    def get(self, model_id: str) -> ModelEntry:
        entry = self.models.get(model_id)
        if entry is None:
            from difflib import get_close_matches

            close = get_close_matches(model_id, list(self.models), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "run `mm-agent models` for the list"
            raise MMAgentError(f"unknown model {model_id!r}", field="model", fix=hint)
        return entry

    def check_version(self, version: str) -> str:
        if version not in self.versions.ids:
            raise MMAgentError(
                f"unknown MindSpeed-MM version {version!r}",
                field="mm_version",
                fix=f"use one of {', '.join(self.versions.ids)}",
            )
        return version


@functools.lru_cache(maxsize=4)
def _load(data_dir: str) -> Registry:
    path = Path(data_dir)
    return Registry(load_models(path), load_versions(path))


def user_models_dir(workspace: Path | None = None) -> Path:
    return (workspace or served_workspace()) / ".mm-agent" / "models"


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return ()
    out = []
    for item in entries:
        if item.name.endswith(".yaml") and not item.name.startswith("."):
            st = item.stat()
            out.append((item.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _with_user_models(data_dir: str, folder: str, signature: tuple[tuple[str, int, int], ...]) -> Registry:
    shipped = _load(data_dir)
    models = dict(shipped.models)
    for name, _, _ in signature:
        path = Path(folder) / name
        try:
            entry = ModelEntry.model_validate(read_yaml(path))
        except ValidationError as exc:
            raise validation_error(path, exc) from exc
        if entry.user is None:
            raise MMAgentError(
                "a workspace model file needs its `user:` block (it is how mm-agent finds the model's code)",
                file=str(path),
                field="user",
                fix="write it again with `mm-agent new-model NAME --yes`, or delete the file",
            )
        if entry.id != path.stem:
            raise MMAgentError(
                f"id {entry.id!r} differs from the file name",
                file=str(path),
                field="id",
                fix=f"rename the file to {entry.id}.yaml",
            )
        if entry.id in shipped.models:
            raise MMAgentError(
                f"{entry.id!r} is a shipped model's id",
                file=str(path),
                field="id",
                fix="scaffold your model under another name (mm-agent new-model OTHER_NAME --yes) and delete this file",
            )
        models[entry.id] = entry
    return Registry(models, shipped.versions)


def shipped_registry() -> Registry:
    """The models mm-agent ships, without any workspace's own (what generated docs and skills describe)."""
    return _load(os.environ.get("MM_AGENT_REGISTRY_DIR", str(DATA_DIR)))


def get_registry() -> Registry:
    """The process-wide registry (override the data folder with MM_AGENT_REGISTRY_DIR), plus the workspace's own
    models; re-read when a file in `.mm-agent/models/` changes."""
    folder = user_models_dir()
    signature = _signature(folder)
    if not signature:
        return shipped_registry()
    return _with_user_models(os.environ.get("MM_AGENT_REGISTRY_DIR", str(DATA_DIR)), str(folder), signature)
