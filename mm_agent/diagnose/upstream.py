"""MindSpeed-MM's own error messages that are not meant for users, each group with the reason.

The catalog (`signatures/*.yaml`) must know every message a MindSpeed-MM user can meet: each `raise`,
`ensure_valid` and error-level log/print in `mindspeed_mm/` of the releases the fidelity suite judges
(tests/fidelity/test_raise_sites.py walks them with `ast`). What no user meets is listed in
`upstream_messages.yaml` next to the signatures, as data: groups of sites selected by file globs, exception
classes and message regexes, each with a kind and a reason. A site is covered when a signature matches its
message or one rule here selects it; the test fails on any other, and on any rule that selects nothing
(so the list cannot keep stale entries).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mm_agent.registry import load_data

UPSTREAM_MESSAGES = Path(__file__).with_name("upstream_messages.yaml")

# Why a site is not a message users meet:
# - no_message: the exception carries no text, so a log shows the class name only (the traceback's frames
#   say where; no signature can match an empty message);
# - passes_on: the text is another error's (`raise RuntimeError(e)`, a caught message re-raised): the
#   original error is what a log shows first and what a signature matches;
# - internal_invariant: a check between MindSpeed-MM's own functions (tensor shapes and dtypes handed from
#   one layer to the next, process-group and registry bookkeeping, call-order guards) that a configuration
#   or a data set cannot reach without a user-facing check failing first;
# - other_backend: code that only runs on the MindSpore backend (`mindspeed_mm/mindspore/`), never in the
#   torch_npu jobs mm-agent renders and diagnoses (or a CUDA-only path);
# - not_a_failure: printed with an error mark, but the code carries on (a fallback value, a skipped item).
SiteKind = Literal["no_message", "passes_on", "internal_invariant", "other_backend", "not_a_failure"]


class SiteRule(BaseModel):
    """A group of raise/log sites selected by every criterion it sets (at least one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="stable lower_snake_case name of the group")
    kind: SiteKind
    reason: str = Field(min_length=20, description="why users never meet these messages")
    files: list[str] = Field(
        default_factory=list,
        description="fnmatch globs of paths inside the MindSpeed-MM tree (`*` crosses `/`), e.g. mindspeed_mm/mindspore/*",
    )
    exceptions: list[str] = Field(
        default_factory=list,
        description="exception class names as raised (ValueError, IsNotValidError), or logger.error / print",
    )
    messages: list[str] = Field(
        default_factory=list,
        description="Python regexes searched in the message's literal text, `{}` standing for each hole",
    )
    expressions: list[str] = Field(
        default_factory=list,
        description="Python regexes that must match the whole source expression of a message with no literal "
        "text (`e`, `str(e)`, `msg`); '' selects sites with no message at all",
    )

    @field_validator("id")
    @classmethod
    def _id_format(cls, value: str) -> str:
        if not value or not value.replace("_", "").isalnum() or value.lower() != value:
            raise ValueError("id must be lower_snake_case")
        return value

    @field_validator("messages", "expressions")
    @classmethod
    def _regexes_compile(cls, values: list[str]) -> list[str]:
        for source in values:
            try:
                re.compile(source)
            except re.error as exc:
                raise ValueError(f"regex {source!r} does not compile: {exc}") from exc
        return values

    @model_validator(mode="after")
    def _selects_something(self) -> SiteRule:
        if not (self.files or self.exceptions or self.messages or self.expressions):
            raise ValueError("a rule needs at least one of files, exceptions, messages, expressions")
        if self.messages and self.expressions:
            raise ValueError("messages select literal messages and expressions the others: use one per rule")
        return self

    def selects(self, file: str, exception: str, template: str, expression: str) -> bool:
        """Whether a site (its file, exception class, literal template or, without one, its expression) is ours."""
        if self.files and not any(fnmatch.fnmatchcase(file, glob) for glob in self.files):
            return False
        if self.exceptions and exception not in self.exceptions:
            return False
        if self.messages and not (template and any(re.search(p, template) for p in self.messages)):
            return False
        if self.expressions:
            return not template and any(re.fullmatch(p, expression) for p in self.expressions)
        return True


class UpstreamMessages(BaseModel):
    """The whole file: the releases it was judged against and the not-user-facing groups."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    releases: list[str] = Field(min_length=1, description="MindSpeed-MM releases whose trees were walked")
    not_user_facing: list[SiteRule]

    @field_validator("not_user_facing")
    @classmethod
    def _unique_ids(cls, rules: list[SiteRule]) -> list[SiteRule]:
        ids = [rule.id for rule in rules]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"rule ids used twice: {twice}")
        return rules

    def rule_for(self, file: str, exception: str, template: str, expression: str) -> SiteRule | None:
        """The first rule that selects the site, if any."""
        return next(
            (r for r in self.not_user_facing if r.selects(file, exception, template, expression)), None
        )


def load_upstream_messages(path: Path | None = None) -> UpstreamMessages:
    """The validated list; a bad file fails naming the file and the field."""
    return load_data(UpstreamMessages, path or UPSTREAM_MESSAGES, schema="mm_agent/diagnose/upstream.py")


@functools.cache
def get_upstream_messages() -> UpstreamMessages:
    """The shipped list, loaded once per process."""
    return load_upstream_messages()
