"""One cell of the step report (`tests/fidelity/step_report.py`): each judge's `rows(upstream)` gives these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """`ok`: True = the step passed its judge, False = it did not, None = nothing to judge (the step does not
    apply, or it is marked unsupported in data with the fix); `text` says which and how much."""

    ok: bool | None
    text: str
