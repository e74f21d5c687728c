"""What each model's dataset reader reads, as data: `registry/data/dataset_formats.yaml`, validated at load.

One answer per (model, task, backend, MindSpeed-MM version): the record layout the job's reader takes (`combine`:
data.txt + a data.json of `{path, cap}` records; `standard`: a data.jsonl of `{file, captions}` records; `mllm`:
conversations in the data config's attr shape), or why mm-agent writes nothing for it and what a user does instead.
`prepare_dataset` writes that layout, `render_job` points the job's data config at its file by default, and
`validate_configs` checks records against its keys; steps (issue 26-D) call `reader_format` for the "prepare the
dataset" step. Pure data + lookups: no I/O beyond the one YAML file, nothing heavy imported.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import DATA_DIR, get_registry, load_data
from mm_agent.registry.schema import VersionRange

FORMATS_FILE = DATA_DIR / "dataset_formats.yaml"

FormatId = Literal["combine", "standard", "mllm"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecordFormat(_Frozen):
    """A record layout prepare_dataset writes, and how its reader treats a record that lacks a key."""

    title: str
    index: str = Field(description="file name render points the data config at, and prepare writes")
    list_file: str | None = Field(default=None, description="combine mode's `<root>,<index>` line file")
    storage_mode: str | None = Field(default=None, description="basic_parameters.data_storage_mode")
    path_key: str | None = None
    caption_key: str | None = None
    meta_keys: tuple[str, ...] = ()
    missing_path: str
    missing_caption: str
    cite: tuple[str, ...] = ()


class ReaderRef(_Frozen):
    file: str = Field(description="path inside the MindSpeed-MM tree")
    symbol: str = Field(description="Class, Class.method or function that reads the records")


class Unsupported(_Frozen):
    reason: str
    fix: str


class ReaderEntry(_Frozen):
    tasks: tuple[str, ...]
    backends: tuple[str, ...] = ()  # empty: every backend of those tasks
    versions: VersionRange = VersionRange()
    format: FormatId | None = None
    reader: ReaderRef | None = None
    keys: tuple[str, ...] = Field(default=(), description="record keys the reader takes (checked with ast)")
    stock_config: str | None = Field(default=None, description="the stock data config of this reader")
    cite: tuple[str, ...] = ()
    unsupported: Unsupported | None = None

    @model_validator(mode="after")
    def _one_answer(self) -> ReaderEntry:
        if (self.format is None) == (self.unsupported is None):
            raise ValueError("give either a format mm-agent writes or `unsupported` (reason + fix), not both")
        return self


class FormatTable(_Frozen):
    formats: dict[str, RecordFormat]
    models: dict[str, tuple[ReaderEntry, ...]]

    @model_validator(mode="after")
    def _known_formats(self) -> FormatTable:
        for model, entries in self.models.items():
            for entry in entries:
                if entry.format is not None and entry.format not in self.formats:
                    raise ValueError(f"{model}: unknown format {entry.format!r}")
        return self


class ReaderFormat(_Frozen):
    """The answer for one job: its reader, and the layout mm-agent writes for it (None when unsupported)."""

    model: str
    task: str
    version: str
    entry: ReaderEntry
    format_id: FormatId | None
    format: RecordFormat | None

    @property
    def supported(self) -> bool:
        return self.format is not None

    @property
    def index(self) -> str:
        """The index file name the job reads by default (render's dataset_file, prepare's output)."""
        return self.format.index if self.format is not None else "data.json"

    def describe(self) -> str:
        """One line for a step or a refusal: what the reader reads, or why mm-agent writes nothing."""
        entry, fmt = self.entry, self.format
        reader = f"{entry.reader.symbol} ({entry.reader.file})" if entry.reader else "its own loader"
        if fmt is None:
            assert entry.unsupported is not None
            return f"{self.model} {self.task}: {entry.unsupported.reason}"
        keys = f" records {{{fmt.path_key}, {fmt.caption_key}}}" if fmt.path_key else ""
        listed = f" listed in {fmt.list_file}" if fmt.list_file else ""
        return f"{self.model} {self.task}: {reader} reads {fmt.index}{keys}{listed}"


@lru_cache(maxsize=1)
def load_formats() -> FormatTable:
    return load_data(FormatTable, FORMATS_FILE, schema="mm_agent/dataset/formats.py")


def _matches(entry: ReaderEntry, task: str, backend: str | None, version: str) -> bool:
    if task not in entry.tasks or not entry.versions.contains(version):
        return False
    return not entry.backends or backend is None or backend in entry.backends


def reader_format(model: str, task: str, version: str, backend: str | None = None) -> ReaderFormat:
    """The reader of `model`'s `task` job at MindSpeed-MM `version` (and `backend`, where a task has two).

    Raises MMAgentError when the table has no answer (a registry model or task the data file lacks)."""
    table = load_formats()
    entries = [e for e in table.models.get(model, ()) if _matches(e, task, backend, version)]
    if not entries and model not in table.models:
        entries = _scaffolded(model, task)
    if not entries:
        raise MMAgentError(
            f"no dataset reader is recorded for {model} {task} at MindSpeed-MM {version}",
            field="model",
            fix="add the model's reader to mm_agent/registry/data/dataset_formats.yaml",
        )
    entry = entries[0]
    fmt = table.formats[entry.format] if entry.format else None
    return ReaderFormat(
        model=model, task=task, version=version, entry=entry, format_id=entry.format, format=fmt
    )


def _scaffolded(model: str, task: str) -> list[ReaderEntry]:
    """A user's scaffolded model (mm-agent new-model): its own dataset class reads a JSON list of {path, cap}
    records relative to data_folder, which is the combine layout's data.json."""
    entry = get_registry().models.get(model)
    if entry is None or entry.user is None or task != "t2v":
        return []
    reader = ReaderRef(file=entry.user.files["dataset"], symbol=f"{entry.user.dataset_class}.__getitem__")
    return [ReaderEntry(tasks=("t2v",), format="combine", reader=reader, keys=("path", "cap"))]


def default_index(model: str, task: str, version: str, backend: str | None = None) -> str:
    """The index file name a job of this model reads when the user names none (`data.json` when unknown)."""
    try:
        return reader_format(model, task, version, backend).index
    except MMAgentError:
        return "data.json"


def prepare_step(
    model: str, task: str, version: str, dataset_dir: str, backend: str | None = None
) -> tuple[list[str] | None, str]:
    """The "prepare the dataset" step of a job (for the steps of issue 26-D): the `mm-agent dataset` argv that
    writes what the job's reader reads (None when mm-agent writes nothing for it) and one line saying what it
    writes, or why not and what to do instead."""
    answer = reader_format(model, task, version, backend)
    if answer.format is None:
        assert answer.entry.unsupported is not None
        return None, f"{answer.describe()}; {answer.entry.unsupported.fix}"
    argv = ["mm-agent", "dataset", dataset_dir, "--model", model, "--task", task, "--mm-version", version]
    if answer.format_id == "mllm":
        argv += ["--index", "<conversations.json>"]
    return [*argv, "--yes"], answer.describe()
