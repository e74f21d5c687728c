"""Declared deviations from MindSpeed-MM's stock examples, and the keys that are the user's to choose.

A rendered job is compared with the stock example of the same version (tests/fidelity). Every difference
must be either a *user choice* (a path, or a value the request sets: iterations, sizes, layout) or a
*declared deviation*: a data entry in `registry/data/deviations/<model>.yaml` that names the file and key
and says why mm-agent differs on purpose. Both lists are data, validated here at load.

Files:
- `deviations/<model>.yaml`: `deviations: [{model, task?, backend?, size?, versions?, file, key, reason,
  evidence}]`; `model` must equal the file stem (one file per model). `evidence: [{file, text, present?, tree?,
  versions?}]` is the upstream text the reason rests on (a stock value, the line of code that reads or ignores a
  key); tests/fidelity/test_deviation_evidence.py re-finds each at every version the deviation covers, so a reason
  that is (or becomes) false fails there instead of standing in the data.
- `deviations/_user_choices.yaml`: `user_choices: [{key, files?, kind, reason}]`; `kind: path` = a location
  that is always the user's (dropped whenever both sides set it), `kind: request` = a value the request can
  set (dropped only when the request set it; with defaults it must equal the stock value).

Keys: a flag (`--micro-batch-size`), a launcher flag (`torchrun --nnodes`), an exported env var
(`TASK_QUEUE_ENABLE`) or a dotted config key with list indexes (`predictor.num_layers`,
`dataset_param.basic_parameters.0.data_path`). `file` and `key` are shell-style patterns (`fnmatch`).
"""

from __future__ import annotations

import functools
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mm_agent.errors import MMAgentError
from mm_agent.registry import read_yaml, validation_error
from mm_agent.registry.schema import Backend, TaskId, VersionRange

DEVIATIONS_DIR = Path(__file__).with_name("data") / "deviations"
USER_CHOICES_FILE = "_user_choices.yaml"
SCHEMA = "mm_agent/registry/deviations.py"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _reason_text(value: str) -> str:
    if len(value.strip()) < 10:
        raise ValueError("reason must say why (at least 10 characters), not be empty or a placeholder")
    return value.strip()


class Evidence(_Frozen):
    """Upstream text a deviation's reason rests on: `file` (in the `tree` checkout of the deviation's version) holds
    `text` (or, `present: false`, does not), whitespace runs compared as one space."""

    file: str = Field(min_length=3, description="path inside the upstream checkout, e.g. examples/x/y.sh")
    text: str = Field(min_length=3, description="text the file holds (whitespace-insensitive)")
    present: bool = Field(default=True, description="false: the claim is that the file does not hold `text`")
    tree: Literal["MindSpeed-MM", "MindSpeed", "Megatron-LM"] = "MindSpeed-MM"
    versions: VersionRange | None = Field(
        default=None, description="where this evidence holds, if narrower than the deviation's versions"
    )

    @field_validator("file")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith(("/", "~")) or ".." in Path(value).parts or "\\" in value:
            raise ValueError("file is a path inside the upstream checkout (relative, no '..')")
        return value

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if len(" ".join(value.split())) < 3:
            raise ValueError("text must quote at least 3 non-blank characters of the file")
        return value


class Deviation(_Frozen):
    """One key where mm-agent's rendered file differs from the stock example on purpose."""

    model: str = Field(min_length=1)
    task: TaskId | None = Field(default=None, description="None = every task")
    backend: Backend | None = Field(default=None, description="None = every backend")
    size: str | None = Field(default=None, description="None = every size")
    versions: VersionRange = VersionRange()
    file: str = Field(min_length=1, description="rendered file (job-relative path, fnmatch pattern)")
    key: str = Field(min_length=1, description="flag, env var or dotted config key (fnmatch pattern)")
    reason: str = Field(description="why mm-agent differs from the stock example")
    evidence: list[Evidence] = Field(
        min_length=1,
        description="the upstream text the reason rests on (re-found at each version by the fidelity suite)",
    )

    @field_validator("reason")
    @classmethod
    def _reason_says_why(cls, value: str) -> str:
        return _reason_text(value)

    def applies(
        self, *, model: str, task: str, size: str, version: str, backend: str | None, file: str, key: str
    ) -> bool:
        return (
            self.model == model
            and self.task in (None, task)
            and (self.backend is None or backend is None or self.backend == backend)
            and self.size in (None, size)
            and self.versions.contains(version)
            and fnmatchcase(file, self.file)
            and fnmatchcase(key, self.key)
        )


class DeviationFile(_Frozen):
    deviations: list[Deviation] = Field(min_length=1)


class UserChoice(_Frozen):
    """A key whose value belongs to the user (paths) or to the request (iterations, sizes, layout)."""

    key: str = Field(min_length=1, description="fnmatch pattern over difference keys")
    files: str = Field(default="*", description="fnmatch pattern over rendered file names")
    kind: Literal["path", "request"]
    reason: str

    @field_validator("reason")
    @classmethod
    def _reason_says_why(cls, value: str) -> str:
        return _reason_text(value)

    def matches(self, file: str, key: str) -> bool:
        return fnmatchcase(file, self.files) and fnmatchcase(key, self.key)


class UserChoiceFile(_Frozen):
    user_choices: list[UserChoice] = Field(min_length=1)


def load_deviations(directory: Path | None = None) -> dict[str, list[Deviation]]:
    """Every `<model>.yaml` in the deviations folder, by model; each entry's model must be the file stem."""
    folder = directory or DEVIATIONS_DIR
    out: dict[str, list[Deviation]] = {}
    for path in sorted(folder.glob("*.yaml")):
        if path.name.startswith("_"):
            continue
        try:
            parsed = DeviationFile.model_validate(read_yaml(path))
        except ValidationError as exc:
            raise validation_error(path, exc, SCHEMA) from exc
        for index, entry in enumerate(parsed.deviations):
            if entry.model != path.stem:
                raise MMAgentError(
                    f"entry for model {entry.model!r} in the file of {path.stem!r}",
                    file=str(path),
                    field=f"deviations.{index}.model",
                    fix=f"set model: {path.stem} or move the entry to deviations/{entry.model}.yaml",
                )
        out[path.stem] = list(parsed.deviations)
    return out


def load_user_choices(directory: Path | None = None) -> list[UserChoice]:
    path = (directory or DEVIATIONS_DIR) / USER_CHOICES_FILE
    try:
        return list(UserChoiceFile.model_validate(read_yaml(path)).user_choices)
    except ValidationError as exc:
        raise validation_error(path, exc, SCHEMA) from exc


@functools.lru_cache(maxsize=2)
def _cached(directory: str) -> tuple[dict[str, list[Deviation]], list[UserChoice]]:
    folder = Path(directory)
    return load_deviations(folder), load_user_choices(folder)


def deviations_for(model: str) -> list[Deviation]:
    return list(_cached(str(DEVIATIONS_DIR))[0].get(model, []))


def user_choices() -> list[UserChoice]:
    return list(_cached(str(DEVIATIONS_DIR))[1])
