"""Mask secrets in text and structured answers before they leave mm-agent.

A training or conversion log can hold a token (an env dump, a command line, a config echoed at start-up),
and every tool answer reaches a model. The patterns are data (`registry/data/secrets.yaml`, validated and
compiled once at first use, their examples checked); this module is the one place that applies them:
`redact` for a line or text, `redact_data` for anything a tool returns (pydantic models, dicts, lists), used
by tail_logs, job_status and diagnose_errors (evidence, and titles/causes/fixes that quote a log) and by
`mm-agent logs`.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mm_agent.registry import DATA_DIR, load_data

SECRETS_FILE = DATA_DIR / "secrets.yaml"
MASK = "***"
B = TypeVar("B", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MaskExample(_Strict):
    line: str
    secret: str = Field(min_length=1, description="text that must be gone from the masked line")


class SecretRule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    what: str = Field(min_length=1)
    regex: str = Field(description="Python regex with a named group `secret` (replaced by ***)")
    keep_names: str | None = Field(
        default=None, description="a match whose `name` group fully matches this is left alone"
    )
    masks: list[MaskExample] = Field(min_length=1)
    keeps: list[str] = Field(default_factory=list)

    @field_validator("regex", "keep_names")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex {value!r} does not compile: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _groups(self) -> SecretRule:
        groups = re.compile(self.regex).groupindex
        if "secret" not in groups:
            raise ValueError(f"rule {self.id}: the regex has no named group `secret`")
        if self.keep_names is not None and "name" not in groups:
            raise ValueError(f"rule {self.id}: keep_names needs a named group `name` in the regex")
        return self


class SecretTable(_Strict):
    rules: list[SecretRule] = Field(min_length=1)

    @model_validator(mode="after")
    def _examples(self) -> SecretTable:
        """Each rule masks its own examples; no rule changes a line listed as one to keep."""
        ids = [r.id for r in self.rules]
        if len(set(ids)) != len(ids):
            raise ValueError(f"rule ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
        compiled = _compile(self)
        for rule, one in zip(self.rules, compiled, strict=True):
            for example in rule.masks:
                masked = _apply([one], example.line)
                if example.secret in masked:
                    raise ValueError(
                        f"rule {rule.id}: {example.line!r} keeps {example.secret!r} ({masked!r})"
                    )
            for line in rule.keeps:
                if _apply(compiled, line) != line:
                    raise ValueError(
                        f"rule {rule.id}: {line!r} must stay but becomes {_apply(compiled, line)!r}"
                    )
        return self


class _Compiled:
    def __init__(self, rule: SecretRule) -> None:
        self.regex = re.compile(rule.regex)
        self.keep = re.compile(rule.keep_names) if rule.keep_names else None

    def sub(self, text: str) -> str:
        def mask(m: re.Match[str]) -> str:
            if self.keep is not None and self.keep.fullmatch(m.group("name") or ""):
                return m.group(0)
            start, end = m.span("secret")
            if start < 0:
                return m.group(0)
            base = m.start()
            whole = m.group(0)
            return whole[: start - base] + MASK + whole[end - base :]

        return self.regex.sub(mask, text)


def _compile(table: SecretTable) -> list[_Compiled]:
    return [_Compiled(rule) for rule in table.rules]


def _apply(rules: list[_Compiled], text: str) -> str:
    for rule in rules:
        text = rule.sub(text)
    return text


def load_secret_rules(path: Path = SECRETS_FILE) -> SecretTable:
    return load_data(SecretTable, path, schema="mm_agent/redact.py")


@functools.lru_cache(maxsize=1)
def _rules() -> list[_Compiled]:
    return _compile(load_secret_rules())


def redact(text: str) -> str:
    """`text` with every secret the rules know replaced by *** (names, flags and prefixes kept)."""
    return _apply(_rules(), text)


def _redact_value(key: str, value: str) -> str:
    """A string under a dict key: masked as a whole when the key names a secret (`{"HF_TOKEN": "x"}`)."""
    value = redact(value)
    if not value or value == MASK:
        return value
    probe = redact(f"{key}={value}")
    return MASK if probe == f"{key}={MASK}" else value


def redact_data(data: Any) -> Any:
    """`data` (strings, lists, dicts, nested) with secrets masked; other values unchanged."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {
            k: _redact_value(k, v) if isinstance(k, str) and isinstance(v, str) else redact_data(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact_data(v) for v in data]
    if isinstance(data, tuple):
        return tuple(redact_data(v) for v in data)
    return data


def redact_model(model: B) -> B:
    """A copy of a pydantic model with every string in it masked (validated again as its own type)."""
    return type(model).model_validate(redact_data(model.model_dump()))
