"""Where mm-agent's native converters deliberately write something MindSpeed-MM's own converters do not.

The list is data (`mappings/upstream_deviations.yaml`): each entry names the converter, the kind of
difference a bitwise comparison with MindSpeed-MM's output finds (a tensor only one side writes, an extra
file, ...), the exact names it concerns, optionally where (rank file and state dict, shell patterns), and why.
`tests/fidelity/test_converters.py` runs both converters on the same tiny models and fails on any difference
this table does not allow, and on any entry no case shows (a stale one). No torch here.
"""

from __future__ import annotations

import functools
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mm_agent.convert.mapping import DEVIATIONS_STEM, MAPPINGS_DIR
from mm_agent.errors import MMAgentError
from mm_agent.registry import read_yaml, validation_error

DEVIATIONS_FILE = MAPPINGS_DIR / f"{DEVIATIONS_STEM}.yaml"

DiffKind = Literal[
    "file_missing",  # MindSpeed-MM writes a file mm-agent does not
    "file_extra",  # mm-agent writes a file MindSpeed-MM does not
    "file_bytes",  # a non-checkpoint file (the tracker) differs
    "entry_missing",  # a top-level entry of a rank file only MindSpeed-MM writes
    "entry_extra",  # ... only mm-agent writes
    "entry_order",
    "entry_value",  # a non-tensor entry (checkpoint_version) differs
    "tensor_missing",  # a tensor of a state dict only MindSpeed-MM writes
    "tensor_extra",  # ... only mm-agent writes
    "tensor_order",
    "tensor_dtype",
    "tensor_shape",
    "tensor_stride",
    "tensor_bytes",
    "pt_record",  # a zip record of a rank file differs although its tensors and their order agree
    "upstream_error",  # MindSpeed-MM's converter fails on an input mm-agent converts (name: the exception)
]


class Difference(BaseModel):
    """One difference found comparing MindSpeed-MM's output tree with mm-agent's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: DiffKind
    file: str = Field(description="path relative to the target dir, with `:<state dict>` for tensors")
    name: str = Field(description="the tensor, entry or file the difference is about")
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.name} in {self.file}" + (f" ({self.detail})" if self.detail else "")


class Deviation(BaseModel):
    """One declared difference, with its reason."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", description="kebab-case, unique")
    converters: list[str] = Field(
        min_length=1, description="converter classes (each with a table in mappings/)"
    )
    kind: DiffKind
    names: list[str] = Field(min_length=1, description="exact tensor/entry/file names it allows")
    where: list[str] = Field(
        default_factory=list,
        description="shell patterns over `file` (e.g. `release/mp_rank_??_000/model_optim_rng.pt:model`); "
        "empty: anywhere",
    )
    reason: str = Field(min_length=40, description="why mm-agent differs, and what MindSpeed-MM does")

    @model_validator(mode="after")
    def _known_converter(self) -> Deviation:
        unknown = [c for c in self.converters if not (MAPPINGS_DIR / f"{c}.yaml").is_file()]
        if unknown:
            raise ValueError(f"converters without a table in mm_agent/convert/mappings/: {unknown}")
        for field, values in (("converters", self.converters), ("names", self.names)):
            if len(set(values)) != len(values):
                raise ValueError(f"{self.id}: {field} repeat")
        return self

    def allows(self, converter: str, diff: Difference) -> bool:
        return (
            converter in self.converters
            and diff.kind == self.kind
            and diff.name in self.names
            and (not self.where or any(fnmatchcase(diff.file, p) for p in self.where))
        )


class DeviationTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    deviations: list[Deviation]

    @model_validator(mode="after")
    def _unique(self) -> DeviationTable:
        ids = [d.id for d in self.deviations]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"deviation ids repeat: {dup}")
        return self

    def allowing(self, converter: str, diff: Difference) -> Deviation | None:
        """The declared deviation that allows `diff` of `converter`, or None."""
        return next((d for d in self.deviations if d.allows(converter, diff)), None)

    def for_converter(self, converter: str) -> list[Deviation]:
        return [d for d in self.deviations if converter in d.converters]


@functools.cache
def load_deviations(path: Path = DEVIATIONS_FILE) -> DeviationTable:
    """The validated table; a malformed file names the file and the field."""
    try:
        return DeviationTable.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise validation_error(path, exc, schema="mm_agent/convert/deviations.py") from exc
    except OSError as exc:
        raise MMAgentError(
            f"cannot read {path}: {exc.strerror}", file=str(path), fix="restore it from the repository"
        ) from exc


def plan_notes(converter: str, state_dicts: list[str], names: set[str]) -> list[str]:
    """What a planned conversion writes differently from MindSpeed-MM's mm-convert, by the table: the
    declared tensor deviations among `names` (the MM tensors it writes) whose `where` matches one of its
    `state_dicts` (`<rank file>:<model|model<i>>`). Shown in the plan so nobody mistakes them for a bug."""
    notes = []
    for dev in load_deviations().for_converter(converter):
        if dev.kind not in ("tensor_extra", "tensor_missing"):
            continue
        hit = [n for n in dev.names if n in names]
        placed = not dev.where or any(fnmatchcase(sd, p) for sd in state_dicts for p in dev.where)
        if hit and placed:
            verb = "writes" if dev.kind == "tensor_extra" else "leaves out"
            notes.append(
                f"{verb} {', '.join(hit)} where MindSpeed-MM's mm-convert does not: declared deviation "
                f"{dev.id} (mm_agent/convert/mappings/upstream_deviations.yaml)"
            )
    return notes
