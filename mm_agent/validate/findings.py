"""Typed input and output of `validate_configs`, and the sink rules report into."""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import BaseModel, Field

from mm_agent.fields import MAX_PATHS, PathText
from mm_agent.names import shown

Severity = Literal["error", "warning", "info"]


class Finding(BaseModel):
    severity: Severity
    rule: str = Field(description="stable rule id, e.g. pp.layers_sum")
    file: str = Field(description="absolute path of the file the finding is about")
    field: str | None = Field(default=None, description="dotted key path, script variable or flag")
    line: int | None = Field(default=None, description="1-based line in `file`")
    message: str
    fix: str = Field(description="what to change, concretely")


class FileSummary(BaseModel):
    path: str
    kind: str = Field(description="shell, feature_data, sora_model, fe_data, fe_model, tools, data_txt, ...")


class ValidationReport(BaseModel):
    ok: bool = Field(description="no errors (with strict: no warnings either)")
    findings: list[Finding]
    files: list[FileSummary]
    error_count: int
    warning_count: int
    ran_code_from: str | None = Field(
        default=None, description="the MindSpeed-MM checkout whose Python ran to judge the launches (mm_root)"
    )


class ValidateRequest(BaseModel):
    paths: list[PathText] = Field(max_length=MAX_PATHS, description="job directories and/or individual files")
    strict: bool = Field(default=False, description="count warnings as errors")
    mm_root: PathText | None = Field(
        default=None,
        description="MindSpeed-MM checkout: its parser judges each launch (runs its code, if the operator trusts it)",
    )


class Sink:
    """Collects findings; drops exact duplicates (a model shared by two scripts is checked twice)."""

    def __init__(self) -> None:
        self._seen: set[tuple[object, ...]] = set()
        self.findings: list[Finding] = []

    def add(
        self,
        severity: Severity,
        rule: str,
        file: str,
        message: str,
        fix: str,
        *,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        # Findings are text: a file name that is not UTF-8 (in any of these) is shown escaped (`names.shown`)
        file, message, fix = shown(file), shown(message), shown(fix)
        field = shown(field) if field is not None else None
        key = (severity, rule, file, field, line, message)
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(
            Finding(severity=severity, rule=rule, file=file, field=field, line=line, message=message, fix=fix)
        )

    error = functools.partialmethod(add, "error")
    warning = functools.partialmethod(add, "warning")
    info = functools.partialmethod(add, "info")

    def sorted(self) -> list[Finding]:
        order = {"error": 0, "warning": 1, "info": 2}
        return sorted(
            self.findings, key=lambda f: (f.file, f.line or 0, order[f.severity], f.rule, f.field or "")
        )
